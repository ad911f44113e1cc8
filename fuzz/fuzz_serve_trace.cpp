// fuzz_serve_trace: kvlab serve-sim's request file (cli/serve_sim.h) on arbitrary bytes.
//
// Input: the file's text. Seeds: small valid files (fuzz/make_seeds.cpp).
// Checks: parsing ends in a kvlab::Error or requests; the first few of them (outputs of at most
// four tokens) run through the scheduler on a tiny random model, each request refused by
// Scheduler::add in one Error or served bitwise equal to decoding it alone.
#include <cstdint>
#include <string>

#include "cpu_backend.h"
#include "fuzz_util.h"
#include "serve_sim.h"
#include "speculative.h"

using namespace kvlab;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
    static const Model m = random_model(Config{8, 8, 1, 2, 1, 16, 12}, 7);
    std::vector<ServeRequest> requests;
    try {
        requests = cli::parse_serve_trace(std::string(reinterpret_cast<const char*>(data), size), nullptr, "fuzz");
    } catch (const Error&) {
        return 0;
    }
    CpuBackend backend(m);
    SchedulerConfig sc;
    sc.block_size = 2, sc.n_blocks = 8, sc.max_batch_tokens = 5;
    Scheduler s(backend, m, sc);
    std::vector<ServeRequest> served;
    for (ServeRequest r : requests) {
        if (served.size() == 4) break;
        r.max_new_tokens = std::min(r.max_new_tokens, 4);
        r.arrival = std::min(r.arrival, 8);
        try {
            s.add(r);
            served.push_back(r);
        } catch (const Error&) {
        }
    }
    while (s.step()) FUZZ_CHECK(s.steps() < 1000, "fuzz_serve_trace: no end after 1000 steps");
    CachedDecoder alone(m);
    for (std::size_t i = 0; i < served.size(); i++)
        FUZZ_CHECK(greedy_decode(alone, served[i].prompt, served[i].max_new_tokens).logits == s.result(int(i)).logits,
                   "fuzz_serve_trace: request %zu differs from decoding it alone", i);
    return 0;
}
