#include "decode_problem.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

#include "fa/error.hpp"
#include "fa/lists.hpp"

namespace fa::stage13 {

namespace {

std::string list_text(const std::vector<int>& xs) {
    std::string out;
    for (size_t i = 0; i < xs.size(); ++i) out += (i == 0 ? "" : i + 1 == xs.size() ? " or " : ", ") + std::to_string(xs[i]);
    return out;
}

// splitmix64: the same stream from every standard library.
struct Random {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
    // Standard normal by Box-Muller (one of the pair).
    double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
};

// Element offset of (b, row, head, 0) in a (B, rows, H, d) buffer.
size_t at(int64_t b, int64_t row, int64_t h, int64_t rows, int64_t heads, int64_t d) {
    return size_t(((b * rows + row) * heads + h) * d);
}

}  // namespace

const std::vector<int>& supported_head_dims() {
    static const std::vector<int> dims{64, 128};
    return dims;
}

int64_t DecodeProblem::max_seq_k() const {
    int64_t m = 0;
    for (int64_t b = 0; b < batch(); ++b) m = std::max(m, seq_k(b));
    return m;
}

int64_t DecodeProblem::total_keys() const {
    int64_t t = 0;
    for (int64_t b = 0; b < batch(); ++b) t += seq_k(b);
    return t;
}

double DecodeProblem::softmax_scale() const { return scale ? *scale : 1.0 / std::sqrt(double(head_dim)); }

DecodeProblem make_decode_problem(std::vector<int64_t> cache_seqlens, int64_t seq_q, int64_t heads_q, int64_t heads_k,
                                  int64_t head_dim, bool append, std::optional<double> scale) {
    DecodeProblem p;
    p.cache_seqlens = std::move(cache_seqlens), p.seq_q = seq_q, p.heads_q = heads_q, p.heads_k = heads_k, p.head_dim = head_dim;
    p.append = append, p.scale = scale;
    p.validate();
    return p;
}

void DecodeProblem::validate() const {
    if (cache_seqlens.empty()) throw InputError("--cache-seqlens is empty: give one cached length per sequence, e.g. 1000,37,0");
    for (size_t b = 0; b < cache_seqlens.size(); ++b) {
        if (cache_seqlens[b] < 0) {
            throw InputError("cache_seqlens[" + std::to_string(b) + "] is " + std::to_string(cache_seqlens[b]) + ": it must be at least 0");
        }
    }
    if (batch() > 65535) throw InputError("--batch " + std::to_string(batch()) + ": at most 65535 sequences");
    if (seq_q < 1 || seq_q > kMaxSeqQ) {
        throw InputError("--seq-q " + std::to_string(seq_q) + " is not supported by stage 13: give 1 to " + std::to_string(kMaxSeqQ) +
                         " new rows per sequence (a decoding or speculative step)");
    }
    require_positive("--heads", heads_q);
    require_positive("--kv-heads", heads_k);
    if (heads_q % heads_k != 0) {
        throw InputError("--heads " + std::to_string(heads_q) + " is not a multiple of --kv-heads " + std::to_string(heads_k) +
                         ": each K/V head serves a whole group of query heads (Hk = Hq, a divisor, or 1)");
    }
    if (heads_q > 4096) throw InputError("--heads " + std::to_string(heads_q) + ": at most 4096");
    const std::vector<int>& dims = supported_head_dims();
    if (std::find(dims.begin(), dims.end(), head_dim) == dims.end()) {
        throw InputError("--head-dim " + std::to_string(head_dim) + " is not supported by stage 13: use " + list_text(dims));
    }
    if (scale && !std::isfinite(*scale)) throw InputError("--scale must be a finite number (default 1/sqrt(head_dim))");
    double keys = 0;
    for (int64_t b = 0; b < batch(); ++b) keys += double(seq_k(b));
    if (keys > double(INT32_MAX)) {
        throw InputError("the batch holds " + std::to_string(int64_t(keys)) + " keys in all: at most 2147483647 (int32 offsets)");
    }
}

std::string DecodeProblem::describe() const {
    std::ostringstream s;
    s << "B=" << batch() << " seq_q=" << seq_q << " Hq=" << heads_q << " Hk=" << heads_k << " (G=" << group() << ") d=" << head_dim
      << " cache_seqlens=";
    const int64_t shown = std::min<int64_t>(batch(), 8);
    for (int64_t b = 0; b < shown; ++b) s << (b ? "," : "") << cache_seqlens[size_t(b)];
    if (shown < batch()) s << ",... (" << batch() << " sequences)";
    s << (append ? " append" : " no-append") << " causal scale=" << softmax_scale();
    return s.str();
}

VarlenProblem DecodeProblem::varlen() const {
    std::vector<int64_t> q(size_t(batch()), seq_q), k;
    for (int64_t b = 0; b < batch(); ++b) k.push_back(seq_k(b));
    VarlenProblem vp;
    vp.cu_seqlens_q = cu_seqlens_from_lengths(q);
    vp.cu_seqlens_k = cu_seqlens_from_lengths(k);
    vp.total_q = vp.cu_seqlens_q.back(), vp.total_k = vp.cu_seqlens_k.back();
    vp.heads_q = heads_q, vp.heads_k = heads_k, vp.head_dim = head_dim, vp.scale = scale;
    vp.window = Window::causal();
    vp.validate();
    return vp;
}

double DecodeProblem::kv_bytes(int bytes_per_element) const {
    return 2.0 * double(total_keys()) * double(heads_k) * double(head_dim) * bytes_per_element;
}

void check_page_size(int64_t page_size) {
    const bool power_of_two = page_size > 0 && (page_size & (page_size - 1)) == 0;
    if (!power_of_two || page_size < kMinPageSize || page_size > kMaxPageSize) {
        throw InputError("--page-size " + std::to_string(page_size) + " is not allowed: use a power of two from " +
                         std::to_string(kMinPageSize) + " to " + std::to_string(kMaxPageSize) + " keys (16, 32, 64, 128, 256, 512)");
    }
}

void CacheGeometry::validate(const DecodeProblem& p) const {
    check_page_size(page_size);
    if (num_pages < 1) throw InputError("the pool has " + std::to_string(num_pages) + " pages: it needs at least 1");
    if (pages_per_seq < 1) throw InputError("block tables of " + std::to_string(pages_per_seq) + " entries: at least 1");
    if (double(num_pages) * double(page_size) > double(INT32_MAX)) {
        throw InputError("a pool of " + std::to_string(num_pages) + " pages of " + std::to_string(page_size) +
                         " keys holds more than 2147483647 keys (int32 row numbers)");
    }
    if (int64_t(block_table.size()) != p.batch() * pages_per_seq) {
        throw InputError("the block table has " + std::to_string(block_table.size()) + " entries for " + std::to_string(p.batch()) +
                         " sequences of " + std::to_string(pages_per_seq) + " pages: it must have B x pages_per_seq");
    }
    std::vector<int64_t> owner(size_t(num_pages), -1);  // b * pages_per_seq + j of the entry that reaches each page
    for (int64_t b = 0; b < p.batch(); ++b) {
        const int64_t keys = p.seq_k(b);
        if (keys > capacity()) {
            throw InputError("sequence " + std::to_string(b) + " has " + std::to_string(keys) + " keys" +
                             (p.append ? " after the append (" + std::to_string(p.cache_seqlens[size_t(b)]) + " cached + " +
                                             std::to_string(p.seq_q) + " new)"
                                       : std::string()) +
                             ", beyond its block table of " + std::to_string(pages_per_seq) + " pages of " + std::to_string(page_size) +
                             " keys (" + std::to_string(capacity()) + "): give more pages per sequence or shorter lengths");
        }
        for (int64_t j = 0; j < ceil_div(keys, page_size); ++j) {
            const int64_t page_id = page(b, j);
            if (page_id < 0 || page_id >= num_pages) {
                throw InputError("block_table[" + std::to_string(b) + "][" + std::to_string(j) + "] = " + std::to_string(page_id) +
                                 " is outside the pool: pages are numbered 0 to " + std::to_string(num_pages - 1) +
                                 " (entries past a sequence's last key are not read and may be -1)");
            }
            int64_t& first = owner[size_t(page_id)];
            if (first >= 0 && p.append) {
                throw InputError("page " + std::to_string(page_id) + " is reached by block_table[" + std::to_string(first / pages_per_seq) +
                                 "][" + std::to_string(first % pages_per_seq) + "] and block_table[" + std::to_string(b) + "][" +
                                 std::to_string(j) + "]: the append writes pages, so each may belong to one entry only");
            }
            if (first < 0) first = b * pages_per_seq + j;
        }
    }
}

std::string CacheGeometry::describe() const {
    return "pages of " + std::to_string(page_size) + " keys, " + std::to_string(num_pages) + " pages in the pool, block tables of " +
           std::to_string(pages_per_seq) + " entries (" + std::to_string(capacity()) + " keys per sequence)";
}

CacheGeometry make_paged_geometry(const DecodeProblem& p, int64_t page_size, uint64_t seed, int64_t spare_pages) {
    check_page_size(page_size);
    CacheGeometry g;
    g.page_size = page_size;
    g.pages_per_seq = std::max<int64_t>(1, ceil_div(p.max_seq_k(), page_size));
    int64_t used = 0;
    for (int64_t b = 0; b < p.batch(); ++b) used += ceil_div(p.seq_k(b), page_size);
    g.num_pages = std::max<int64_t>(1, used + std::max<int64_t>(0, spare_pages));
    // The pool's pages in a seeded random order (Fisher-Yates), dealt to the sequences in turn.
    std::vector<int32_t> order(size_t(g.num_pages));
    std::iota(order.begin(), order.end(), 0);
    Random rng{seed ^ 0x5eed0f9a9e5ull};
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(rng.next() % i)]);
    g.block_table.assign(size_t(p.batch() * g.pages_per_seq), -1);
    size_t next = 0;
    for (int64_t b = 0; b < p.batch(); ++b) {
        for (int64_t j = 0; j < ceil_div(p.seq_k(b), page_size); ++j) g.block_table[size_t(b * g.pages_per_seq + j)] = order[next++];
    }
    return g;
}

CacheGeometry geometry_from_table(const std::vector<std::vector<int32_t>>& rows, int64_t page_size, int64_t num_pages) {
    CacheGeometry g;
    g.page_size = page_size;
    g.num_pages = num_pages;
    g.pages_per_seq = 1;
    for (const auto& r : rows) g.pages_per_seq = std::max<int64_t>(g.pages_per_seq, int64_t(r.size()));
    g.block_table.assign(rows.size() * size_t(g.pages_per_seq), -1);
    for (size_t b = 0; b < rows.size(); ++b) std::copy(rows[b].begin(), rows[b].end(), g.block_table.begin() + long(b * size_t(g.pages_per_seq)));
    return g;
}

std::vector<std::vector<int32_t>> parse_block_table(const std::string& text) {
    std::vector<std::vector<int32_t>> rows;
    for (const std::string& row : split_list(text, '/')) {
        std::vector<int32_t> r;
        for (const std::string& item : split_list(row, ',')) r.push_back(int32_t(parse_whole(item, "--block-table", text, -1)));
        rows.push_back(r);
    }
    if (rows.empty()) throw InputError("--block-table is empty: give one row of page numbers per sequence, e.g. 3,0/2,1");
    return rows;
}

std::vector<int64_t> parse_lengths(const std::string& text, const std::string& option) {
    return fa::parse_lengths(text, option, "1000,37,0");
}

DecodeInputs make_decode_inputs(const DecodeProblem& p, const CacheGeometry& g, Precision precision, uint64_t seed, double q_scale) {
    DecodeInputs in;
    Random rng{seed};
    const int64_t B = p.batch(), d = p.head_dim, Hk = p.heads_k;
    const auto draw = [&](size_t n, double s) {
        std::vector<float> x(n);
        for (float& e : x) e = round_to(precision, float(s * rng.normal()));
        return x;
    };
    in.q = draw(size_t(B * p.seq_q * p.heads_q * d), q_scale);
    if (p.append) {
        in.k_new = draw(size_t(B * p.seq_q * Hk * d), 1.0);
        in.v_new = draw(size_t(B * p.seq_q * Hk * d), 1.0);
    }
    const int64_t cap = g.capacity();
    in.k_cache.assign(size_t(B * cap * Hk * d), std::numeric_limits<float>::quiet_NaN());
    in.v_cache = in.k_cache;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t j = 0; j < std::min(p.cache_seqlens[size_t(b)], cap); ++j) {
            for (int64_t h = 0; h < Hk; ++h) {
                for (int64_t x = 0; x < d; ++x) {
                    in.k_cache[at(b, j, h, cap, Hk, d) + size_t(x)] = round_to(precision, float(rng.normal()));
                    in.v_cache[at(b, j, h, cap, Hk, d) + size_t(x)] = round_to(precision, float(rng.normal()));
                }
            }
        }
    }
    return in;
}

std::vector<float> append_on_host(const DecodeProblem& p, const CacheGeometry& g, const std::vector<float>& cache,
                                  const std::vector<float>& rows) {
    std::vector<float> out = cache;
    if (!p.append) return out;
    const int64_t cap = g.capacity(), Hk = p.heads_k, d = p.head_dim;
    for (int64_t b = 0; b < p.batch(); ++b) {
        for (int64_t i = 0; i < p.seq_q; ++i) {
            for (int64_t h = 0; h < Hk; ++h) {
                std::copy_n(rows.begin() + long(at(b, i, h, p.seq_q, Hk, d)), d,
                            out.begin() + long(at(b, p.cache_seqlens[size_t(b)] + i, h, cap, Hk, d)));
            }
        }
    }
    return out;
}

std::vector<float> to_paged(const DecodeProblem& p, const CacheGeometry& g, const std::vector<float>& cache, float fill) {
    const int64_t Hk = p.heads_k, d = p.head_dim, row = Hk * d;
    std::vector<float> pool(size_t(g.num_pages * g.page_size * row), fill);
    for (int64_t b = 0; b < p.batch(); ++b) {
        for (int64_t j = 0; j < std::min(p.cache_seqlens[size_t(b)], g.capacity()); ++j) {
            const int64_t page_id = g.page(b, j / g.page_size);
            if (page_id < 0 || page_id >= g.num_pages) continue;  // validate() refuses such a table before any kernel runs
            std::copy_n(cache.begin() + long(at(b, j, 0, g.capacity(), Hk, d)), row,
                        pool.begin() + long((page_id * g.page_size + j % g.page_size) * row));
        }
    }
    return pool;
}

std::vector<float> from_paged(const DecodeProblem& p, const CacheGeometry& g, const std::vector<float>& pool) {
    const int64_t Hk = p.heads_k, d = p.head_dim, row = Hk * d;
    std::vector<float> cache(size_t(p.batch() * g.capacity() * row), std::numeric_limits<float>::quiet_NaN());
    for (int64_t b = 0; b < p.batch(); ++b) {
        for (int64_t j = 0; j < p.seq_k(b); ++j) {
            const int64_t page_id = g.page(b, j / g.page_size);
            std::copy_n(pool.begin() + long((page_id * g.page_size + j % g.page_size) * row), row,
                        cache.begin() + long(at(b, j, 0, g.capacity(), Hk, d)));
        }
    }
    return cache;
}

std::vector<float> reached_rows(const DecodeProblem& p, const CacheGeometry& g, std::vector<float> cache) {
    const int64_t row = p.heads_k * p.head_dim;
    for (int64_t b = 0; b < p.batch(); ++b)
        for (int64_t j = p.seq_k(b); j < g.capacity(); ++j)
            std::fill_n(cache.begin() + long((b * g.capacity() + j) * row), row, std::numeric_limits<float>::quiet_NaN());
    return cache;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(x[i]) && std::isnan(y[i])) continue;
        if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return false;
    }
    return true;
}

DecodeReference reference_decode(const DecodeProblem& p, const CacheGeometry& g, const DecodeInputs& in, Precision precision) {
    const VarlenProblem vp = p.varlen();
    const int64_t Hk = p.heads_k, Hq = p.heads_q, d = p.head_dim, B = p.batch(), nq = p.seq_q;
    // The keys each sequence sees after the append, packed back to back: (total_k, Hk, d).
    const std::vector<float> kc = append_on_host(p, g, in.k_cache, in.k_new), vc = append_on_host(p, g, in.v_cache, in.v_new);
    std::vector<float> k(size_t(std::max<int64_t>(1, vp.total_k) * Hk * d)), v(k.size());
    for (int64_t b = 0; b < B; ++b) {
        const size_t n = size_t(p.seq_k(b) * Hk * d);
        std::copy_n(kc.begin() + long(at(b, 0, 0, g.capacity(), Hk, d)), n, k.begin() + long(size_t(vp.cu_seqlens_k[size_t(b)]) * size_t(Hk * d)));
        std::copy_n(vc.begin() + long(at(b, 0, 0, g.capacity(), Hk, d)), n, v.begin() + long(size_t(vp.cu_seqlens_k[size_t(b)]) * size_t(Hk * d)));
    }
    const View4<const float> qv = make_packed_view<const float>(in.q.data(), vp.total_q, Hq, d);
    const View4<const float> kv = make_packed_view<const float>(k.data(), vp.total_k, Hk, d);
    const View4<const float> vv = make_packed_view<const float>(v.data(), vp.total_k, Hk, d);
    DecodeReference r;
    const VarlenReference ref = reference_attention_varlen(vp, qv, kv, vv);
    r.o = ref.o;  // (total_q, Hq, d) is (B, seq_q, Hq, d)
    r.naive = naive_attention_varlen_emulated(precision, vp, qv, kv, vv);
    r.stats = input_stats_varlen(vp, qv, kv, vv);
    // The LSE from (Hq, total_q) to (B, Hq, seq_q).
    r.lse.resize(size_t(B * Hq * nq));
    std::vector<float> naive_lse(r.lse.size());
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < Hq; ++h) {
            for (int64_t i = 0; i < nq; ++i) {
                const size_t from = size_t(h * vp.total_q + b * nq + i), to = size_t((b * Hq + h) * nq + i);
                r.lse[to] = ref.lse[from];
                naive_lse[to] = r.naive.lse[from];
            }
        }
    }
    r.naive.lse = naive_lse;
    return r;
}

Tolerances decode_tolerance(const DecodeReference& ref, Precision precision) {
    return low_precision_tolerance(ref.stats, precision, compare(ref.naive.o, ref.o), compare(ref.naive.lse, ref.lse));
}

SplitChoice choose_splits(const DecodeProblem& p, int sm_count, int blocks_per_sm, int forced) {
    SplitChoice c;
    const int64_t base = p.batch() * p.heads_k * p.row_tiles();
    const int64_t slots = int64_t(std::max(1, sm_count)) * std::max(1, blocks_per_sm);
    const int64_t tiles = ceil_div(p.max_seq_k(), kKeysPerTile);
    const auto fill = [&](int64_t n) {
        const double waves = double(n * base) / double(slots);
        return waves / std::ceil(waves);
    };
    std::ostringstream why;
    if (forced > 0) {
        c.splits = int(std::max<int64_t>(1, std::min<int64_t>({int64_t(forced), int64_t(kMaxSplits), std::max<int64_t>(1, tiles)})));
        why << "--splits " << forced;
        if (c.splits != forced) why << ", capped at " << c.splits << " (a split needs a tile of " << kKeysPerTile << " keys; at most " << kMaxSplits << ")";
    } else {
        const int64_t n_max = std::max<int64_t>(1, std::min<int64_t>(kMaxSplits, tiles / kMinTilesPerSplit));
        double best = 0;
        for (int64_t n = 1; n <= n_max; ++n) best = std::max(best, fill(n));
        int64_t n = 1;
        while (n < n_max && fill(n) < 0.85 * best) ++n;
        c.splits = int(n);
        why << base << " blocks without splitting (B x Hk x row tiles) on " << slots << " slots (" << sm_count << " SMs x "
            << blocks_per_sm << "); splits of at least " << kMinTilesPerSplit << " tiles of " << kKeysPerTile << " keys allow up to "
            << n_max << "; the smallest n whose last wave is within 85% of the best fill (" << int(std::lround(100 * best))
            << "%) is " << n;
    }
    c.blocks = base * c.splits;
    c.wave_fill = fill(c.splits);
    why << ": " << c.blocks << " blocks, last wave " << int(std::lround(100 * c.wave_fill)) << "% full";
    c.why = why.str();
    return c;
}

}  // namespace fa::stage13
