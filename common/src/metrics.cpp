#include "fa/metrics.hpp"

#include <algorithm>
#include <cmath>

namespace fa {

namespace {

template <class Ref>
Metrics compare_impl(const std::vector<float>& out, const std::vector<Ref>& ref) {
    Metrics m;
    const size_t n = std::min(out.size(), ref.size());
    // Sizes that differ are a defect of the caller; count the missing elements as non-finite.
    m.nonfinite = static_cast<int64_t>(std::max(out.size(), ref.size()) - n);
    double sum_abs = 0, dot = 0, out_sq = 0, ref_sq = 0, diff_sq = 0;
    for (size_t i = 0; i < n; ++i) {
        const double o = out[i];
        const double r = static_cast<double>(ref[i]);
        if (!std::isfinite(o) || !std::isfinite(r)) {
            // The same infinity on both sides (LSE = -inf of a row with no visible key) is exact.
            if (!(std::isinf(o) && std::isinf(r) && (o > 0) == (r > 0))) ++m.nonfinite;
            continue;
        }
        const double diff = std::abs(o - r);
        if (diff > m.max_abs) {
            m.max_abs = diff;
            m.worst_index = static_cast<int64_t>(i);
        }
        m.max_rel = std::max(m.max_rel, diff / (std::abs(r) + 1e-6));
        sum_abs += diff;
        dot += o * r;
        out_sq += o * o;
        ref_sq += r * r;
        diff_sq += diff * diff;
        ++m.count;
    }
    m.mean_abs = m.count ? sum_abs / double(m.count) : 0.0;
    m.cosine = (out_sq > 0 && ref_sq > 0) ? dot / std::sqrt(out_sq * ref_sq) : (out_sq == ref_sq ? 1.0 : 0.0);
    m.rel_l2 = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
    return m;
}

}  // namespace

Metrics compare(const std::vector<float>& out, const std::vector<double>& ref) { return compare_impl(out, ref); }
Metrics compare(const std::vector<float>& out, const std::vector<float>& ref) { return compare_impl(out, ref); }

bool passes(const Metrics& m, const Tolerance& tol) {
    return m.nonfinite == 0 && m.max_abs <= tol.max_abs && m.rel_l2 <= tol.rel_l2;
}

}  // namespace fa
