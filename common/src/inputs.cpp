#include "fa/inputs.hpp"

#include <array>
#include <cmath>
#include <random>

#include "fa/error.hpp"

namespace fa {

std::string to_string(InputKind kind) { return kind == InputKind::Normal ? "normal" : "large"; }

namespace {

// Fills `t` in logical order so the values do not depend on the layout.
void fill_normal(HostTensor& t, std::mt19937_64& gen, float multiplier) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto& v = t.view;
    for (int64_t b = 0; b < v.shape[0]; ++b)
        for (int64_t h = 0; h < v.shape[1]; ++h)
            for (int64_t n = 0; n < v.shape[2]; ++n)
                for (int64_t x = 0; x < v.shape[3]; ++x) v(b, h, n, x) = multiplier * normal(gen);
}

}  // namespace

void require_finite(View4<const float> t, const std::string& name) {
    int64_t bad = 0, first = -1, flat = 0;
    std::array<int64_t, 4> at{};
    for (int64_t b = 0; b < t.shape[0]; ++b)
        for (int64_t h = 0; h < t.shape[1]; ++h)
            for (int64_t n = 0; n < t.shape[2]; ++n)
                for (int64_t x = 0; x < t.shape[3]; ++x, ++flat) {
                    if (std::isfinite(t(b, h, n, x))) continue;
                    if (bad++ == 0) {
                        first = flat;
                        at = {b, h, n, x};
                    }
                }
    if (bad == 0) return;
    throw InputError(name + ": " + std::to_string(bad) + " of " + std::to_string(flat) + " values are NaN or inf (first at flat index " +
                     std::to_string(first) + ", (b=" + std::to_string(at[0]) + ", h=" + std::to_string(at[1]) +
                     ", n=" + std::to_string(at[2]) + ", x=" + std::to_string(at[3]) + "))");
}

Inputs make_inputs(const Problem& p, Layout layout, InputKind kind, uint64_t seed) {
    Inputs in{HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, layout),
              HostTensor(p.batch, p.heads, p.seq_k, p.head_dim, layout),
              HostTensor(p.batch, p.heads, p.seq_k, p.head_dim, layout)};
    const float multiplier = kind == InputKind::Large ? kLargeInputScale : 1.0f;
    // One generator per tensor, derived from the seed, so q does not change when Nk does.
    std::mt19937_64 gen_q(seed * 3 + 0), gen_k(seed * 3 + 1), gen_v(seed * 3 + 2);
    fill_normal(in.q, gen_q, multiplier);
    fill_normal(in.k, gen_k, multiplier);
    // V keeps unit scale: large magnitudes are about the scores, not the values averaged.
    fill_normal(in.v, gen_v, 1.0f);
    return in;
}

HostTensor make_output_gradient(const Problem& p, Layout layout, uint64_t seed) {
    HostTensor dout(p.batch, p.heads, p.seq_q, p.head_dim, layout);
    // A fourth stream next to q, k and v's (seed * 3 + 0, 1, 2): offset by an odd constant so it
    // never coincides with any of theirs for another seed.
    std::mt19937_64 gen(seed * 3 + 0x9e3779b97f4a7c15ull);
    fill_normal(dout, gen, 1.0f);
    return dout;
}

}  // namespace fa
