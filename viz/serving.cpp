#include "serving.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "beam.h"
#include "block_store.h"
#include "cpu_backend.h"
#include "scheduler.h"
#include "speculative.h"

namespace kvlab::viz {

namespace {

// Prompts of one to three blocks, half of them opening with a two-block system prompt, outputs of
// half a block to two blocks, arriving about one a step; all within max_seq.
std::vector<ServeRequest> workload(const Config& c, const Settings& s, int bs) {
    std::mt19937_64 rng(s.seed);
    std::uniform_int_distribution<int> token(0, c.vocab_size - 1);
    std::vector<int> system(std::size_t(2 * bs));
    for (int& t : system) t = token(rng);
    std::vector<ServeRequest> out;
    for (int i = 0; i < s.serve_requests; i++) {
        ServeRequest r;
        if (i % 2 == 0) r.prompt = system;
        const int extra = std::uniform_int_distribution<int>(1, 3 * bs)(rng);
        for (int k = 0; k < extra; k++) r.prompt.push_back(token(rng));
        r.max_new_tokens = std::uniform_int_distribution<int>(std::max(1, bs / 2), 2 * bs)(rng);
        r.arrival = i;
        if (int(r.prompt.size()) + r.max_new_tokens > c.max_seq)
            throw Error(
                fmt::format("serving view: a request of {} positions does not fit max_seq {}; use a "
                            "smaller --block-size",
                            r.prompt.size() + r.max_new_tokens, c.max_seq));
        out.push_back(std::move(r));
    }
    return out;
}

ServeSnapshot snapshot(const Scheduler& s) {
    const BlockPool& pool = s.pool();
    const ServeStep& h = s.history().back();
    ServeSnapshot snap;
    snap.step = h.step;
    snap.owner.assign(std::size_t(pool.n_blocks()), -1);
    snap.shared.assign(std::size_t(pool.n_blocks()), 0);
    for (int b = 0; b < pool.n_blocks(); b++) {
        if (pool.published(b) && pool.refcount(b) == 0) snap.owner[std::size_t(b)] = -2;
        snap.shared[std::size_t(b)] = pool.refcount(b) > 1;
    }
    for (const auto& [id, table] : s.block_tables())  // ids increase: the first to map a block keeps it
        for (int b : table)
            if (snap.owner[std::size_t(b)] < 0) snap.owner[std::size_t(b)] = id;
    snap.running = h.running, snap.waiting = h.waiting, snap.admitted = h.admitted;
    snap.preempted = h.preempted, snap.finished = h.finished, snap.decode_rows = h.decode_rows;
    snap.prefill_rows = h.prefill_rows, snap.blocks_used = h.blocks_used;
    snap.fetched = pool.store_stats().fetched, snap.stored = pool.store_stats().offloaded;
    snap.hit_positions = pool.prefix_hit_positions();
    return snap;
}

}  // namespace

ServeRun run_serving(const Model& model, const Settings& settings) {
    const Config& c = model.config();
    const int bs = std::max(1, settings.block_size);
    const std::vector<ServeRequest> requests = workload(c, settings, bs);
    int longest = 0;
    for (const ServeRequest& r : requests) longest = std::max(longest, int(r.prompt.size()) + r.max_new_tokens);
    HostStore store;
    SchedulerConfig sc;
    sc.block_size = bs;
    sc.max_model_len = longest;
    sc.n_blocks = settings.n_blocks > 0 ? settings.n_blocks : 2 * ((longest + bs - 1) / bs) + 2;
    sc.max_batch_tokens = 4 * bs;
    sc.store = &store;
    sc.n_threads = settings.n_threads;
    CpuBackend backend(model);
    Scheduler s(backend, model, sc);
    for (const ServeRequest& r : requests) s.add(r);
    ServeRun run;
    run.n_requests = int(requests.size()), run.n_blocks = run.shown_blocks = sc.n_blocks, run.block_size = bs;
    run.max_batch_tokens = sc.max_batch_tokens;
    while (s.step()) run.steps.push_back(snapshot(s));
    CachedDecoder alone(model, settings.n_threads);
    for (std::size_t i = 0; i < requests.size(); i++)
        run.exact +=
            greedy_decode(alone, requests[i].prompt, requests[i].max_new_tokens).logits == s.result(int(i)).logits;
    return run;
}

ServeRun run_beam_view(const Model& model, const Settings& settings, const std::vector<int>& prompt) {
    BeamConfig bc;
    bc.width = settings.beam_width, bc.steps = settings.steps, bc.block_size = std::max(1, settings.block_size);
    bc.n_threads = settings.n_threads;
    CpuBackend backend(model);
    const BeamRun beams = BeamSearch(backend, model, bc).run(prompt);
    ServeRun run;
    run.beams = true;
    run.n_requests = bc.width, run.n_blocks = beams.n_blocks, run.block_size = bc.block_size;
    NaiveDecoder naive(model, settings.n_threads);
    for (std::size_t k = 0; k < beams.steps.size(); k++) {
        ServeSnapshot snap;
        snap.step = int(k);
        snap.owner.assign(std::size_t(run.n_blocks), -1);
        std::vector<int> maps(std::size_t(run.n_blocks), 0);  // [n_blocks] tables mapping each block
        int unshared = 0;
        for (std::size_t b = 0; b < beams.steps[k].size(); b++) {
            const BeamState& beam = beams.steps[k][b];
            unshared += int(beam.table.size());
            for (int blk : beam.table) {
                if (maps[std::size_t(blk)]++ == 0) snap.owner[std::size_t(blk)] = int(b), snap.blocks_used++;
                run.shown_blocks = std::max(run.shown_blocks, blk + 1);
            }
            run.checked++;
            run.exact += naive.forward(beam.tokens) == beam.logits;
        }
        for (int m : maps) snap.shared.push_back(m > 1);
        snap.running = int(beams.steps[k].size());
        run.unshared.push_back(unshared);
        run.steps.push_back(std::move(snap));
    }
    return run;
}

}  // namespace kvlab::viz
