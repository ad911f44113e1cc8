// kvlab proofs: RapidCheck generators the verification suite and the tests share.
#pragma once

#include <rapidcheck.h>

#include <vector>

namespace kvlab::proofs {

// RapidCheck scales ranges by a size that grows over a run, which would leave most cases near
// the minimum; drawing at full size covers the whole range in every case (shrinking still
// finds the small ones).
inline constexpr int kFullSize = 100;

// inRange [lo, hi) drawn at full size.
template <class T>
rc::Gen<T> full_range(T lo, T hi) {
    return rc::gen::resize(kFullSize, rc::gen::inRange(lo, hi));
}

// n_kv_heads for n_heads query heads: any divisor, as grouped-query attention requires.
inline rc::Gen<int> gen_n_kv_heads(int n_heads) {
    std::vector<int> divisors;
    for (int d = 1; d <= n_heads; d++)
        if (n_heads % d == 0) divisors.push_back(d);
    return rc::gen::elementOf(divisors);
}

}  // namespace kvlab::proofs
