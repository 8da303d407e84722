// Deliberately broken FlashAttention variants, and stand-ins for low-precision stages (forward and
// backward in the arithmetic of stages 07 and 09): what the tests of the tolerance rules
// (test_tolerance.cpp, test_gradient_tolerance.cpp, the fake_lowp_stage executable) run them on.
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

/// What a backward in bf16 or fp16 can get wrong, on the keys of one tile (keys 64 to 127).
enum class BackwardFault {
    None,         ///< the correct algorithm
    DropKeyTile,  ///< the tile's keys are left out: their dK, dV stay 0 and dQ misses their terms
    FlipDsTile,   ///< dS of the tile's keys with the wrong sign
};

/// Stage 07's forward in its arithmetic, one query row at a time (a stand-in for the tensor-core
/// forward): q, k, v rounded to `precision` when read, raw scores summed in float32,
/// \f$P = 2^{s\,c - m c}\f$ with \f$c = \text{scale}\log_2 e\f$ by one fused multiply-add against the
/// rounded \f$m c\f$, \f$\ell\f$ summed from the float32 P while \f$P V\f$ takes P rounded to the
/// precision, O = acc / l rounded, LSE = m scale + ln l. (Stage 07 visits the keys in tiles and
/// rescales; on one pass it is the same arithmetic.) On a row whose softmax is one-hot and whose
/// largest score is in the thousands, the largest P is \f$2^{\pm u |m c|}\f$, not 1, and O is a row
/// of V times \f$\text{fl}(p)/p\f$: up to two 16-bit roundings away from it.
inline void flash_forward_lowp(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                               View4<float> o, View3<float> lse, Precision precision) {
    const float scale = static_cast<float>(p.softmax_scale()), scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
    const int64_t d = p.head_dim;
    const auto in = [&](float x) { return round_to(precision, x); };
    std::vector<float> s(static_cast<size_t>(p.seq_k)), acc(static_cast<size_t>(d));
    for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads; ++h)
            for (int64_t i = 0; i < p.seq_q; ++i) {
                const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
                for (int64_t j = 0; j < end; ++j) {
                    float dot = 0.0f;
                    for (int64_t x = 0; x < d; ++x) dot += in(q(b, h, i, x)) * in(k(b, h, j, x));
                    s[size_t(j)] = dot;
                    m = std::max(m, dot);
                }
                std::fill(acc.begin(), acc.end(), 0.0f);
                const float m_scaled = m * scale_log2;
                for (int64_t j = 0; j < end; ++j) {
                    const float p_j = std::exp2(std::fma(s[size_t(j)], scale_log2, -m_scaled));
                    l += p_j;
                    for (int64_t x = 0; x < d; ++x) acc[size_t(x)] += round_to(precision, p_j) * in(v(b, h, j, x));
                }
                for (int64_t x = 0; x < d; ++x) o(b, h, i, x) = l > 0.0f ? round_to(precision, acc[size_t(x)] / l) : 0.0f;
                lse(b, h, i) = l > 0.0f ? m * scale + std::log(l) : -std::numeric_limits<float>::infinity();
            }
}

/// Stage 09's backward in its arithmetic, one query row at a time, with `fault`: q, k, v, O and dO
/// rounded to `precision` when read, P recomputed from the LSE by exp2, \f$D = \sum_x dO\,O\f$ and
/// \f$dS = P (dP - D)\f$ in float32, P and dS rounded as the operands of dV, dQ and dK, every sum in
/// float32, the gradients rounded when written.
inline void flash_backward_lowp(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                                View4<const float> o, View3<const float> lse, View4<const float> dout, View4<float> dq,
                                View4<float> dk, View4<float> dv, Precision precision, BackwardFault fault) {
    const float scale = static_cast<float>(p.softmax_scale()), scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
    const int64_t d = p.head_dim;
    const auto in = [&](float x) { return round_to(precision, x); };
    std::vector<float> dq_i(static_cast<size_t>(d)), dk_h(static_cast<size_t>(p.seq_k * d)), dv_h(static_cast<size_t>(p.seq_k * d));
    for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads; ++h) {
            std::fill(dk_h.begin(), dk_h.end(), 0.0f);
            std::fill(dv_h.begin(), dv_h.end(), 0.0f);
            for (int64_t i = 0; i < p.seq_q; ++i) {
                const float lse_log2 = lse(b, h, i) * 1.4426950408889634f;
                float D = 0.0f;
                for (int64_t x = 0; x < d; ++x) D += in(dout(b, h, i, x)) * in(o(b, h, i, x));
                std::fill(dq_i.begin(), dq_i.end(), 0.0f);
                const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                for (int64_t j = 0; j < end; ++j) {
                    const bool in_tile = j >= 64 && j < 128;
                    if (fault == BackwardFault::DropKeyTile && in_tile) continue;
                    float s = 0.0f, dp = 0.0f;
                    for (int64_t x = 0; x < d; ++x) {
                        s += in(q(b, h, i, x)) * in(k(b, h, j, x));
                        dp += in(dout(b, h, i, x)) * in(v(b, h, j, x));
                    }
                    const float P = std::exp2(s * scale_log2 - lse_log2);
                    const float dS = (fault == BackwardFault::FlipDsTile && in_tile ? -1.0f : 1.0f) * P * (dp - D);
                    const float P_low = round_to(precision, P), dS_low = round_to(precision, dS);
                    for (int64_t x = 0; x < d; ++x) {
                        dv_h[size_t(j * d + x)] += P_low * in(dout(b, h, i, x));
                        dq_i[size_t(x)] += dS_low * in(k(b, h, j, x));
                        dk_h[size_t(j * d + x)] += dS_low * in(q(b, h, i, x));
                    }
                }
                for (int64_t x = 0; x < d; ++x) dq(b, h, i, x) = round_to(precision, scale * dq_i[size_t(x)]);
            }
            for (int64_t j = 0; j < p.seq_k; ++j)
                for (int64_t x = 0; x < d; ++x) {
                    dk(b, h, j, x) = round_to(precision, scale * dk_h[size_t(j * d + x)]);
                    dv(b, h, j, x) = round_to(precision, dv_h[size_t(j * d + x)]);
                }
        }
}

}  // namespace fa::test
