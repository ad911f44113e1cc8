#include "beam.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <memory>

#include "kernels.h"

namespace kvlab {

namespace {

struct Candidate {
    double logprob;
    int beam, token;
};

// The best `width` continuations of every beam, ranked by log-probability, then beam, then token.
std::vector<Candidate> best(const std::vector<BeamState>& beams, int width, int vocab_size) {
    std::vector<Candidate> all;
    for (int b = 0; b < int(beams.size()); b++)
        for (int t = 0; t < vocab_size; t++)
            all.push_back({beams[std::size_t(b)].logprob +
                               double(token_logprob(beams[std::size_t(b)].logits.data(), vocab_size, t)),
                           b, t});
    const std::size_t keep = std::min(all.size(), std::size_t(width));
    std::partial_sort(all.begin(), all.begin() + std::ptrdiff_t(keep), all.end(),
                      [](const Candidate& x, const Candidate& y) {
                          if (x.logprob != y.logprob) return x.logprob > y.logprob;
                          return x.beam != y.beam ? x.beam < y.beam : x.token < y.token;
                      });
    all.resize(keep);
    return all;
}

}  // namespace

BeamSearch::BeamSearch(Backend& backend, const Model& model, const BeamConfig& config)
    : backend_(backend), model_(model), config_(config) {
    if (config.width < 1 || config.steps < 0 || config.block_size < 1 || config.n_threads < 1)
        throw Error(fmt::format(
            "beam: width {}, steps {}, block size {} and threads {} (width, block size and threads at least 1)",
            config.width, config.steps, config.block_size, config.n_threads));
}

BeamRun BeamSearch::run(const std::vector<int>& prompt) {
    const Config& c = model_.config();
    if (prompt.empty() || int(prompt.size()) + config_.steps > c.max_seq)
        throw Error(fmt::format("beam: a prompt of {} and {} steps need 1..max_seq = {} positions", prompt.size(),
                                config_.steps, c.max_seq));
    const int bs = config_.block_size, per_beam = (c.max_seq + bs - 1) / bs;
    BlockPool pool(c, bs, config_.width * (per_beam + 1), false, backend_.memory());
    pool.set_kv_format(config_.kv_format);
    CachedDecoder dec(backend_, nullptr);
    dec.exec.attention = config_.attention;
    dec.exec.n_threads = config_.n_threads;
    std::vector<std::unique_ptr<PagedCache>> caches;
    caches.push_back(std::make_unique<PagedCache>(pool, 0, 0));
    BeamRun run;
    std::vector<Cache*> step_caches{caches[0].get()};
    const std::vector<float>& first = dec.step(step_caches, std::vector<std::vector<int>>{prompt});
    run.steps.push_back({{prompt, 0.0, first, caches[0]->block_table()}});
    run.n_blocks = pool.n_blocks();
    const auto note_blocks = [&] {
        int unshared = 0;
        for (const auto& cache : caches) unshared += (cache->length() + bs - 1) / bs;
        run.peak_blocks = std::max(run.peak_blocks, pool.n_used());
        run.peak_unshared_blocks = std::max(run.peak_unshared_blocks, unshared);
    };
    note_blocks();
    for (int s = 0; s < config_.steps; s++) {
        const std::vector<BeamState>& beams = run.steps.back();
        const std::vector<Candidate> chosen = best(beams, config_.width, c.vocab_size);
        std::vector<std::unique_ptr<PagedCache>> next;
        std::vector<BeamState> states;
        std::vector<std::vector<int>> rows;
        for (const Candidate& k : chosen) {
            const int from = parent_transform ? parent_transform(k.beam, int(beams.size())) : k.beam;
            next.push_back(caches[std::size_t(from)]->fork(int(next.size())));
            BeamState st = beams[std::size_t(k.beam)];
            st.tokens.push_back(k.token);
            st.logprob = k.logprob;
            states.push_back(std::move(st));
            rows.push_back({k.token});
        }
        caches = std::move(next);  // the parents go: blocks only they held return to the pool
        step_caches.clear();
        for (const auto& cache : caches) step_caches.push_back(cache.get());
        const std::vector<float>& logits = dec.step(step_caches, rows);
        const std::size_t V = std::size_t(c.vocab_size);
        for (std::size_t b = 0; b < states.size(); b++) {
            states[b].logits.assign(logits.begin() + std::ptrdiff_t(b * V),
                                    logits.begin() + std::ptrdiff_t((b + 1) * V));
            states[b].table = caches[b]->block_table();
        }
        run.steps.push_back(std::move(states));
        note_blocks();
    }
    return run;
}

}  // namespace kvlab
