#include "fa/varlen.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "fa/error.hpp"
#include "fa/philox.hpp"

namespace fa {

int64_t VarlenProblem::max_seq_q() const {
    int64_t m = 0;
    for (int64_t b = 0; b < batch(); ++b) m = std::max(m, seq_q(b));
    return m;
}

int64_t VarlenProblem::max_seq_k() const {
    int64_t m = 0;
    for (int64_t b = 0; b < batch(); ++b) m = std::max(m, seq_k(b));
    return m;
}

double VarlenProblem::softmax_scale() const { return scale ? *scale : 1.0 / std::sqrt(double(head_dim)); }

int64_t VarlenProblem::visible_pairs_per_head() const {
    int64_t pairs = 0;
    for (int64_t b = 0; b < batch(); ++b)
        for (int64_t i = 0; i < seq_q(b); ++i) pairs += visible_key_range(i, seq_q(b), seq_k(b), window).size();
    return pairs;
}

namespace {

// The divisors of n, as a list a message can show: "1, 2, 3 or 6".
std::string divisors_of(int64_t n) {
    std::vector<int64_t> d;
    for (int64_t k = 1; k <= n && d.size() < 12; ++k)
        if (n % k == 0) d.push_back(k);
    std::ostringstream out;
    for (size_t i = 0; i < d.size(); ++i) out << (i == 0 ? "" : (i + 1 == d.size() ? " or " : ", ")) << d[i];
    return out.str();
}

// cu_seqlens must start at 0, never decrease and end at the packed length.
void check_cu_seqlens(const char* name, const char* total_name, const std::vector<int32_t>& cu, int64_t total) {
    if (total < 0) throw InputError(std::string(total_name) + " is " + std::to_string(total) + ": it must be at least 0");
    if (cu.size() < 2) {
        throw InputError(std::string(name) + " has " + std::to_string(cu.size()) +
                         " entries: it needs B+1 >= 2 (0, then the end of each sequence)");
    }
    if (cu[0] != 0) {
        throw InputError(std::string(name) + "[0] is " + std::to_string(cu[0]) + ": the first sequence starts at row 0");
    }
    for (size_t n = 1; n < cu.size(); ++n) {
        if (cu[n] < cu[n - 1]) {
            std::ostringstream msg;
            msg << name << " is not nondecreasing: entry " << n << " is " << cu[n] << " after entry " << n - 1 << " = "
                << cu[n - 1] << " (sequence " << n - 1 << " would have length " << int64_t(cu[n]) - cu[n - 1]
                << "); each entry is where a sequence ends, so lengths must be >= 0";
            throw InputError(msg.str());
        }
    }
    if (cu.back() != total) {
        std::ostringstream msg;
        msg << name << " ends at " << cu.back() << " but " << total_name << " is " << total
            << ": its last entry must be the number of packed rows";
        throw InputError(msg.str());
    }
}

void check_window_bound(const char* side, int64_t value) {
    if (value < -1) {
        std::ostringstream msg;
        msg << "--window " << side << " " << value << " is not allowed: use -1 (unbounded) or a number of keys >= 0";
        throw InputError(msg.str());
    }
}

}  // namespace

void Dropout::validate(int64_t sequences, int64_t heads) const {
    if (!(p >= 0.0 && p < 1.0)) {
        std::ostringstream msg;
        msg << "--dropout " << p << " is outside [0, 1): it is the probability of dropping an entry of P";
        throw InputError(msg.str());
    }
    if (dropout_threshold(p) > 255) {
        std::ostringstream msg;
        msg << "--dropout " << p << " would drop every entry: dropout compares one random byte per entry with "
            << "round(256 p) (fa/philox.hpp), so p must be below 255.5/256 = 0.998046875";
        throw InputError(msg.str());
    }
    if (enabled() && (sequences > 65536 || heads > 65536)) {
        std::ostringstream msg;
        msg << "dropout numbers sequences and query heads in 16 bits each (fa/philox.hpp): B = " << sequences
            << " and --heads " << heads << " must both be at most 65536";
        throw InputError(msg.str());
    }
}

void VarlenProblem::validate() const {
    require_positive("--heads", heads_q);
    require_positive("--kv-heads", heads_k);
    require_positive("--head-dim", head_dim);
    if (heads_q % heads_k != 0) {
        std::ostringstream msg;
        msg << "--heads " << heads_q << " is not a multiple of --kv-heads " << heads_k
            << ": each key/value head serves a whole group of query heads, so --kv-heads must divide --heads (here "
            << divisors_of(heads_q) << ")";
        throw InputError(msg.str());
    }
    check_cu_seqlens("cu_seqlens_q", "total_q", cu_seqlens_q, total_q);
    check_cu_seqlens("cu_seqlens_k", "total_k", cu_seqlens_k, total_k);
    if (cu_seqlens_q.size() != cu_seqlens_k.size()) {
        std::ostringstream msg;
        msg << "cu_seqlens_q has " << cu_seqlens_q.size() << " entries (B = " << cu_seqlens_q.size() - 1
            << ") but cu_seqlens_k has " << cu_seqlens_k.size() << " (B = " << cu_seqlens_k.size() - 1
            << "): both need B+1 entries, one sequence of queries per sequence of keys";
        throw InputError(msg.str());
    }
    if (scale && !std::isfinite(*scale)) {
        throw InputError("--scale must be a finite number (default 1/sqrt(head_dim))");
    }
    check_window_bound("left", window.left);
    check_window_bound("right", window.right);
    if (!std::isfinite(softcap) || softcap < 0) {
        std::ostringstream msg;
        msg << "--softcap " << softcap << " is not allowed: use 0 (off) or a positive finite cap c (scores become c tanh(s/c))";
        throw InputError(msg.str());
    }
    dropout.validate(batch(), heads_q);
    const int64_t limit = std::numeric_limits<int64_t>::max() / 4;
    for (const auto& [rows, heads] : {std::pair{total_q, heads_q}, std::pair{total_k, heads_k}}) {
        if (rows > 0 && heads > limit / rows / head_dim) {
            throw InputError("the problem " + describe() + " has more elements than 64-bit byte offsets can address");
        }
    }
}

std::string VarlenProblem::describe() const {
    const auto lengths = [&](const std::vector<int32_t>& cu) {
        std::ostringstream out;
        for (size_t b = 0; b + 1 < cu.size(); ++b) {
            if (b == 8) {
                out << ",...";
                break;
            }
            out << (b ? "," : "") << int64_t(cu[b + 1]) - cu[b];
        }
        return out.str();
    };
    std::ostringstream out;
    out << "B=" << batch() << " Hq=" << heads_q << " Hk=" << heads_k << " seqlens_q=" << lengths(cu_seqlens_q)
        << " seqlens_k=" << lengths(cu_seqlens_k) << " d=" << head_dim << " scale=" << softmax_scale() << " window=("
        << window.left << "," << window.right << ")";
    if (softcap > 0) out << " softcap=" << softcap;
    if (dropout.enabled()) {
        out << " dropout=" << dropout.p;
        if (dropout_effective_p(dropout.p) != dropout.p) out << " (runs as " << dropout_threshold(dropout.p) << "/256)";
        out << " seed=" << dropout.seed << " offset=" << dropout.offset;
    }
    return out.str();
}

VarlenProblem varlen_from(const Problem& p) {
    VarlenProblem v;
    v.cu_seqlens_q = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(p.batch), p.seq_q));
    v.cu_seqlens_k = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(p.batch), p.seq_k));
    v.total_q = p.batch * p.seq_q;
    v.total_k = p.batch * p.seq_k;
    v.heads_q = v.heads_k = p.heads;
    v.head_dim = p.head_dim;
    v.scale = p.scale;
    v.window = p.causal ? Window::causal() : Window::full();
    return v;
}

std::vector<int32_t> cu_seqlens_from_lengths(const std::vector<int64_t>& lengths) {
    std::vector<int32_t> cu{0};
    int64_t total = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
        if (lengths[b] < 0) {
            throw InputError("sequence " + std::to_string(b) + " has length " + std::to_string(lengths[b]) +
                             ": lengths must be >= 0");
        }
        total += lengths[b];
        if (total > std::numeric_limits<int32_t>::max()) {
            throw InputError("the sequences hold more than 2^31 - 1 rows in all: cu_seqlens are int32");
        }
        cu.push_back(int32_t(total));
    }
    return cu;
}

namespace {

// Fills a packed tensor token by token, head by head, feature by feature: the order of its
// (total, H, d) buffer.
void fill_packed_normal(HostTensor& t, std::mt19937_64& gen, float multiplier) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto& v = t.view;
    for (int64_t n = 0; n < v.shape[2]; ++n)
        for (int64_t h = 0; h < v.shape[1]; ++h)
            for (int64_t x = 0; x < v.shape[3]; ++x) v(0, h, n, x) = multiplier * normal(gen);
}

}  // namespace

Inputs make_varlen_inputs(const VarlenProblem& p, InputKind kind, uint64_t seed) {
    Inputs in{HostTensor(1, p.heads_q, p.total_q, p.head_dim, Layout::BNHD),
              HostTensor(1, p.heads_k, p.total_k, p.head_dim, Layout::BNHD),
              HostTensor(1, p.heads_k, p.total_k, p.head_dim, Layout::BNHD)};
    const float multiplier = kind == InputKind::Large ? kLargeInputScale : 1.0f;
    // One generator per tensor, derived from the seed, as make_inputs() does.
    std::mt19937_64 gen_q(seed * 5 + 0x51ed27u), gen_k(seed * 5 + 0x51ed29u), gen_v(seed * 5 + 0x51ed2bu);
    fill_packed_normal(in.q, gen_q, multiplier);
    fill_packed_normal(in.k, gen_k, multiplier);
    fill_packed_normal(in.v, gen_v, 1.0f);  // V keeps unit scale, as in make_inputs()
    return in;
}

HostTensor make_varlen_output_gradient(const VarlenProblem& p, uint64_t seed) {
    HostTensor dout(1, p.heads_q, p.total_q, p.head_dim, Layout::BNHD);
    std::mt19937_64 gen(seed * 5 + 0x9e3779b97f4a7c15ull);
    fill_packed_normal(dout, gen, 1.0f);
    return dout;
}

}  // namespace fa
