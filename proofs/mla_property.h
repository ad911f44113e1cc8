// kvlab proofs: the MLA property (core/mla.h), shared by `kvlab verify mla-rebuild`,
// `mla-absorbed` and tests/test_mla.cpp.
#pragma once

#include <functional>

#include "mla.h"

namespace kvlab {

// Inside a property: a tiny MLA shape, 1-3 layers, 1-4 heads of head_size 1-8, hidden_dim 1-16,
// vocab_size 1-32, max_seq 1-20, rank 1-8, rope_dim 0, 2 or 4.
MlaConfig draw_mla_config();

// A prompt prefilled in chunks of any sizes, then decoded: at every chunk and step the cached
// decode in `form` equals naive decode in `naive_form` bitwise (a different form must fail).
// reached, if given, hears the case's length T before the first chunk (verify's report).
void mla_property(MlaForm form, MlaForm naive_form, const std::function<void(int T)>& reached = nullptr);

}  // namespace kvlab
