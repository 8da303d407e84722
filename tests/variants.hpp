// Deliberately broken FlashAttention variants, and a stand-in for a low-precision stage: what the
// tests of the tolerance rule (test_tolerance.cpp, the fake_lowp_stage executable) run the rule on.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fa/precision.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa/tensor.hpp"

namespace fa::test {

/// One mistake a tiled implementation can make (each at the second key tile, j = 1, so that the
/// first tile has set a running maximum the mistake can disturb).
enum class Fault {
    None,           ///< the correct algorithm
    SkipRescale,    ///< O_i and l_i are not multiplied by exp(m_old - m_new) when the maximum moves
    DropKeyTile,    ///< the tile's keys are left out
    RepeatKeyTile,  ///< the tile reads the previous tile's keys and values again (a wrong block offset)
};

/// A variant of the tiled online softmax.
struct Variant {
    Fault fault = Fault::None;
    int64_t Bc = 64;                          ///< keys per tile
    Precision precision = Precision::Float32;  ///< q, k, v rounded to it when read, O rounded to it when written
};

/// Stage 04's loops written out one query row at a time, in float32 (any precision only rounds
/// the inputs and O, the way a bf16/fp16 stage stores them), with `variant`'s fault.
inline void flash_variant(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                          View4<float> o, View3<float> lse, const Variant& variant) {
    const float scale = static_cast<float>(p.softmax_scale());
    const int64_t d = p.head_dim;
    const auto in = [&](float x) { return round_to(variant.precision, x); };
    std::vector<float> q_i(static_cast<size_t>(d)), acc(static_cast<size_t>(d)), s(static_cast<size_t>(variant.Bc));
    for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads; ++h)
            for (int64_t i = 0; i < p.seq_q; ++i) {
                for (int64_t x = 0; x < d; ++x) q_i[size_t(x)] = in(q(b, h, i, x));
                const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int64_t j = 0, j0 = 0; j0 < end; ++j, j0 += variant.Bc) {
                    if (j == 1 && variant.fault == Fault::DropKeyTile) continue;
                    const int64_t j1 = std::min(end, j0 + variant.Bc);
                    // The keys this tile reads: its own, or (the fault) the previous tile's.
                    const int64_t key0 = j == 1 && variant.fault == Fault::RepeatKeyTile ? j0 - variant.Bc : j0;
                    float m_tile = -std::numeric_limits<float>::infinity();
                    for (int64_t t = 0; t < j1 - j0; ++t) {
                        float dot = 0.0f;
                        for (int64_t x = 0; x < d; ++x) dot += q_i[size_t(x)] * in(k(b, h, key0 + t, x));
                        s[size_t(t)] = scale * dot;
                        m_tile = std::max(m_tile, s[size_t(t)]);
                    }
                    const float m_new = std::max(m, m_tile);
                    const float rescale = j == 1 && variant.fault == Fault::SkipRescale ? 1.0f : std::exp(m - m_new);
                    l *= rescale;
                    for (float& a : acc) a *= rescale;
                    for (int64_t t = 0; t < j1 - j0; ++t) {
                        const float p_t = std::exp(s[size_t(t)] - m_new);
                        l += p_t;
                        for (int64_t x = 0; x < d; ++x) acc[size_t(x)] += p_t * in(v(b, h, key0 + t, x));
                    }
                    m = m_new;
                }
                for (int64_t x = 0; x < d; ++x) o(b, h, i, x) = l > 0.0f ? round_to(variant.precision, acc[size_t(x)] / l) : 0.0f;
                lse(b, h, i) = l > 0.0f ? m + std::log(l) : -std::numeric_limits<float>::infinity();
            }
}

/// flash_variant() as an AttentionFn.
inline AttentionFn variant_fn(Variant variant) {
    return [variant](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                     View3<float> lse) { flash_variant(p, q, k, v, o, lse, variant); };
}

}  // namespace fa::test
