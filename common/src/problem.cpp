#include "fa/problem.hpp"

#include <cmath>
#include <limits>
#include <sstream>

#include "fa/error.hpp"

namespace fa {

int64_t Problem::visible_pairs_per_head() const {
    if (!causal) return seq_q * seq_k;
    int64_t pairs = 0;
    for (int64_t i = 0; i < seq_q; ++i) pairs += visible_key_end(i, seq_q, seq_k, true);
    return pairs;
}

namespace {

// a * b without overflow, or throw.
int64_t checked_mul(int64_t a, int64_t b, const Problem& p) {
    if (a != 0 && b > std::numeric_limits<int64_t>::max() / 4 / a) {
        throw InputError("the problem " + p.describe() +
                         " has more elements than 64-bit byte offsets can address");
    }
    return a * b;
}

}  // namespace

void Problem::validate() const {
    require_positive("--batch", batch);
    require_positive("--heads", heads);
    require_positive("--seq-q", seq_q);
    require_positive("--seq-k", seq_k);
    require_positive("--head-dim", head_dim);
    if (scale && !std::isfinite(*scale)) {
        throw InputError("--scale must be a finite number (default 1/sqrt(head_dim))");
    }
    const int64_t bh = checked_mul(batch, heads, *this);
    checked_mul(checked_mul(bh, std::max(seq_q, seq_k), *this), head_dim, *this);
}

std::string Problem::describe() const {
    std::ostringstream out;
    out << "B=" << batch << " H=" << heads << " Nq=" << seq_q << " Nk=" << seq_k
        << " d=" << head_dim << " scale=" << softmax_scale() << (causal ? " causal" : " non-causal");
    return out.str();
}

}  // namespace fa
