# expect: differs
# Each step numbers its rows 0..n-1 for RoPE, as if every chunk began the sequence. The first
# chunk is right; every later one rotates its q and k to the wrong angles. Here kvlab's decoder
# runs on a backend whose rope() sees chunk-relative positions.
s|^#include "decode.h"|&\
#include "forwarding.h"|
s|^std::vector<float> prefill(|namespace {\
\
class ChunkRelativeRope final : public ForwardingBackend {\
public:\
    using ForwardingBackend::ForwardingBackend;\
    void rope(Exec\& ex, float* vec, int rows, int n_heads, const int* positions) override {\
        std::vector<int> relative(positions, positions + rows);  // [rows] (host memory: the CPU backend)\
        for (int\& p : relative) p -= positions[0];  // the mistake\
        inner().rope(ex, vec, rows, n_heads, relative.data());\
    }\
};\
\
}  // namespace\
\
&|
s|^    CachedDecoder decoder(backend, cache);.*|    ChunkRelativeRope relative(backend);\
    CachedDecoder decoder(relative, cache);|
