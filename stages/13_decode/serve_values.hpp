/// \file stages/13_decode/serve_values.hpp
/// \brief The serving loop's inputs as a function of where they belong: the value of feature x of
/// head h of token `position` of request `request`, for q, k or v. The GPU fills its buffers with
/// it and the host computes the same numbers for the closing check, so no input is ever copied
/// back to be known.
///
/// The value must come out bit for bit the same on both sides. A Box-Muller normal would not: the
/// device's log and cos are not the host's. So each value is the sum of four 16-bit uniform
/// integers from one hash (exact integer arithmetic), centred and multiplied by one float
/// constant: one rounding, the same on any IEEE machine. The sum of four uniforms is close to a
/// normal (Irwin-Hall), of standard deviation 1 here, and bounded by about ±3.46. The caller rounds
/// it to bf16 or fp16 (round to nearest even on both sides).
#pragma once

#include <cstdint>

#include "fa/config.hpp"

namespace fa::stage13 {

/// Which tensor a value belongs to.
enum class ServeTensor : uint32_t {
    Q = 1,  ///< the query rows
    K = 2,  ///< the keys (the cache)
    V = 3,  ///< the values (the cache)
};

/// splitmix64's finalizer: every bit of `z` moves every bit of the result.
FA_HD inline uint64_t serve_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// The value of element `index` (head x d + feature) of token `position` of request `request` in
/// tensor `tensor`, for the run's `seed`: in [-3.47, 3.47], mean 0, standard deviation 1.
FA_HD inline float serve_value(uint64_t seed, ServeTensor tensor, uint32_t request, uint32_t position, uint32_t index) {
    const uint64_t where = serve_mix((uint64_t(position) << 32 | index) + 0x9e3779b97f4a7c15ull);
    const uint64_t h = serve_mix(seed ^ serve_mix((uint64_t(tensor) << 32 | request) ^ where));
    // Four uniforms on 0..65535: the sum is exact in an int, its mean is 2 x 65535 and its
    // standard deviation 65536 / sqrt(3) = 37837.2 (each uniform's variance is 65536^2 / 12).
    const int sum = int(h & 0xffff) + int((h >> 16) & 0xffff) + int((h >> 32) & 0xffff) + int(h >> 48);
    return float(sum - 131070) * 2.64290e-5f;  // exact conversion (|sum - 131070| < 2^18), one rounded product
}

}  // namespace fa::stage13
