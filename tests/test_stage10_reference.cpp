// Tests of stage 10's CPU groundwork: Philox4x32-10 against Random123's published answers and the
// dropout map built on it (fa/philox.hpp); the packed problem (fa/varlen.hpp); the extended float64
// reference (fa/reference_ext.hpp) against the plain one bit for bit, against repeated K/V, against
// each sequence alone, against explicit masks and the direct soft-cap formula in plain loops, and
// against finite differences with every feature on; the dropout keep mask; unpad/pad
// (fa/unpad.hpp); the uint8 and int32 .npy writers.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fa/error.hpp"
#include "fa/inputs.hpp"
#include "fa/npy.hpp"
#include "fa/philox.hpp"
#include "fa/problem.hpp"
#include "fa/reference.hpp"
#include "fa/reference_backward.hpp"
#include "fa/reference_ext.hpp"
#include "fa/tensor.hpp"
#include "fa/unpad.hpp"
#include "fa/varlen.hpp"

using namespace fa;

namespace {

// ----------------------------------------------------------------------------------------------
// Philox's known answers: Random123 (github.com/DEShawResearch/random123, commit 9545ff64),
// tests/kat_vectors, the philox4x32 lines: rounds, counter (4 words), key (2 words), expected.
struct Kat {
    int rounds;
    PhiloxWords counter;
    PhiloxKey key;
    PhiloxWords expected;
};

constexpr Kat kKats[] = {
    {7, {{0x00000000, 0x00000000, 0x00000000, 0x00000000}}, {{0x00000000, 0x00000000}}, {{0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}}},
    {7, {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}}, {{0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}}},
    {7, {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}}, {{0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}}},
    {10, {{0x00000000, 0x00000000, 0x00000000, 0x00000000}}, {{0x00000000, 0x00000000}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
    {10, {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}}, {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
    {10, {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}}, {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
};

// The generator is constexpr: the compiler checks one answer before any test runs.
static_assert(philox4x32_10(kKats[5].counter, kKats[5].key).w[0] == 0xd16cfe09u);
static_assert(philox4x32_10(kKats[5].counter, kKats[5].key).w[3] == 0x24126ea1u);

// ----------------------------------------------------------------------------------------------
// Small helpers.

// The message of the InputError `f` throws, or "(no error)".
std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const InputError& e) {
        return e.what();
    }
    return "(no error)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The largest finite magnitude (an LSE of -inf is a value to match, not a scale).
double max_abs(const std::vector<double>& x) {
    double m = 0;
    for (double e : x)
        if (std::isfinite(e)) m = std::max(m, std::abs(e));
    return m;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (size_t n = 0; n < a.size(); ++n) {
        if (std::isinf(a[n]) || std::isinf(b[n])) {  // -inf LSEs must agree exactly
            if (a[n] != b[n]) return std::numeric_limits<double>::infinity();
            continue;
        }
        m = std::max(m, std::abs(a[n] - b[n]));
    }
    return m;
}

int64_t nonfinite_count(const std::vector<double>& x, bool allow_minus_inf = false) {
    int64_t bad = 0;
    for (double e : x) bad += !(std::isfinite(e) || (allow_minus_inf && e == -std::numeric_limits<double>::infinity()));
    return bad;
}

// A packed problem from per-sequence lengths.
VarlenProblem make_varlen(const std::vector<int64_t>& lengths_q, const std::vector<int64_t>& lengths_k, int64_t Hq,
                          int64_t Hk, int64_t d) {
    VarlenProblem p;
    p.cu_seqlens_q = cu_seqlens_from_lengths(lengths_q);
    p.cu_seqlens_k = cu_seqlens_from_lengths(lengths_k);
    p.total_q = p.cu_seqlens_q.back();
    p.total_k = p.cu_seqlens_k.back();
    p.heads_q = Hq;
    p.heads_k = Hk;
    p.head_dim = d;
    return p;
}

// Packed inputs and dO of one problem.
struct Drawn {
    Inputs in;
    HostTensor dout;
    View4<const float> q() const { return in.q.cview(); }
    View4<const float> k() const { return in.k.cview(); }
    View4<const float> v() const { return in.v.cview(); }
    View4<const float> d() const { return dout.cview(); }
};

Drawn draw(const VarlenProblem& p, uint64_t seed, InputKind kind = InputKind::Normal) {
    return {make_varlen_inputs(p, kind, seed), make_varlen_output_gradient(p, seed)};
}

VarlenReference forward(const VarlenProblem& p, const Drawn& t) { return reference_attention_varlen(p, t.q(), t.k(), t.v()); }
VarlenGradients backward(const VarlenProblem& p, const Drawn& t) {
    return reference_backward_varlen(p, t.q(), t.k(), t.v(), t.d());
}

// Two runs that must give the same bits: O, LSE and the three gradients compared exactly.
void check_identical(const VarlenReference& fa, const VarlenGradients& ga, const VarlenReference& fb,
                     const VarlenGradients& gb) {
    CHECK(fa.o == fb.o);
    CHECK(fa.lse == fb.lse);
    CHECK(ga.dq == gb.dq);
    CHECK(ga.dk == gb.dk);
    CHECK(ga.dv == gb.dv);
}

// ----------------------------------------------------------------------------------------------
// The forward in plain loops, written from the definitions and not from reference_ext.cpp: the
// window as the predicate of Window's comment, the soft cap as c tanh(s/c), dropout through a keep
// mask (B, Hq, max Nq, max Nk) that zeroes P and scales the rest by 1/(1-p'), p' = round(256 p)/256
// (one random byte per entry).

// Inputs in packed (total, H, d) order, in double.
struct Dense {
    std::vector<double> q, k, v, dout;
};

Dense dense(const Drawn& t) {
    // A packed HostTensor (1, H, total, d) in BNHD stores exactly the (total, H, d) buffer.
    const auto d = [](const HostTensor& x) { return std::vector<double>(x.storage.begin(), x.storage.end()); };
    return {d(t.in.q), d(t.in.k), d(t.in.v), d(t.dout)};
}

bool in_window(int64_t i, int64_t j, int64_t Nq, int64_t Nk, Window w) {
    const int64_t diagonal = i + Nk - Nq;
    return (w.left < 0 || j >= diagonal - w.left) && (w.right < 0 || j <= diagonal + w.right);
}

struct Naive {
    std::vector<double> o, lse;  // (total_q, Hq, d), (Hq, total_q)
};

Naive naive_forward(const VarlenProblem& p, const Dense& t, const std::vector<uint8_t>* keep) {
    const int64_t Hq = p.heads_q, Hk = p.heads_k, d = p.head_dim, G = Hq / Hk;
    const int64_t Nq_max = p.max_seq_q(), Nk_max = p.max_seq_k();
    const double scale = p.softmax_scale(), c = p.softcap;
    Naive out{std::vector<double>(size_t(p.total_q * Hq * d), 0.0),
              std::vector<double>(size_t(Hq * p.total_q), -std::numeric_limits<double>::infinity())};
    for (int64_t b = 0; b < p.batch(); ++b) {
        const int64_t Nq = p.seq_q(b), Nk = p.seq_k(b), q0 = p.cu_seqlens_q[size_t(b)], k0 = p.cu_seqlens_k[size_t(b)];
        std::vector<double> s(static_cast<size_t>(Nk));
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Nq; ++i) {
                const double* q = &t.q[size_t(((q0 + i) * Hq + h) * d)];
                double m = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j < Nk; ++j) {
                    if (!in_window(i, j, Nq, Nk, p.window)) continue;
                    const double* k = &t.k[size_t(((k0 + j) * Hk + h / G) * d)];
                    double dot = 0;
                    for (int64_t x = 0; x < d; ++x) dot += q[x] * k[x];
                    double score = scale * dot;
                    if (c > 0) score = c * std::tanh(score / c);
                    s[size_t(j)] = score;
                    m = std::max(m, score);
                }
                if (m == -std::numeric_limits<double>::infinity()) continue;  // no key: O = 0, LSE = -inf
                double l = 0;
                for (int64_t j = 0; j < Nk; ++j)
                    if (in_window(i, j, Nq, Nk, p.window)) l += std::exp(s[size_t(j)] - m);
                out.lse[size_t(h * p.total_q + q0 + i)] = m + std::log(l);
                double* o = &out.o[size_t(((q0 + i) * Hq + h) * d)];
                for (int64_t j = 0; j < Nk; ++j) {
                    if (!in_window(i, j, Nq, Nk, p.window)) continue;
                    double pij = std::exp(s[size_t(j)] - m) / l;
                    if (keep) pij = (*keep)[size_t(((b * Hq + h) * Nq_max + i) * Nk_max + j)] ? pij / (1 - std::floor(p.dropout.p * 256 + 0.5) / 256) : 0.0;
                    const double* v = &t.v[size_t(((k0 + j) * Hk + h / G) * d)];
                    for (int64_t x = 0; x < d; ++x) o[x] += pij * v[x];
                }
            }
    }
    return out;
}

// L = sum(O o dO): the loss whose gradients reference_backward_varlen() returns.
double loss(const VarlenProblem& p, const Dense& t, const std::vector<uint8_t>* keep) {
    const Naive f = naive_forward(p, t, keep);
    double sum = 0;
    for (size_t n = 0; n < f.o.size(); ++n) sum += f.o[n] * t.dout[n];
    return sum;
}

// dL/dx for every element of q, k or v by central differences (error ~1e-10 at these sizes).
std::vector<double> numerical_gradient(const VarlenProblem& p, Dense t, std::vector<double> Dense::* which,
                                       const std::vector<uint8_t>* keep) {
    constexpr double h = 1e-5;
    std::vector<double>& x = t.*which;
    std::vector<double> grad(x.size());
    for (size_t n = 0; n < x.size(); ++n) {
        const double saved = x[n];
        x[n] = saved + h;
        const double up = loss(p, t, keep);
        x[n] = saved - h;
        const double down = loss(p, t, keep);
        x[n] = saved;
        grad[n] = (up - down) / (2 * h);
    }
    return grad;
}

void check_close(const std::string& name, const std::vector<double>& got, const std::vector<double>& want, double rel) {
    const double err = max_abs_diff(got, want), limit = rel * std::max(max_abs(want), 1e-300);
    INFO(name << ": max |got - want| = " << err << ", limit " << limit);
    CHECK(err <= limit);
}

}  // namespace

// ==============================================================================================
// Philox and the dropout map

TEST_CASE("Philox4x32 reproduces Random123's known answers for 7 and 10 rounds") {
    for (const Kat& kat : kKats) {
        const PhiloxWords got = kat.rounds == 7 ? philox4x32<7>(kat.counter, kat.key) : philox4x32_10(kat.counter, kat.key);
        INFO("rounds " << kat.rounds << " counter word 0 " << std::hex << kat.counter.w[0]);
        for (int w = 0; w < 4; ++w) CHECK(got.w[w] == kat.expected.w[w]);
    }
    // The constants the rounds use, as Random123 and the SC'11 paper publish them.
    CHECK(kPhiloxM0 == 0xD2511F53u);
    CHECK(kPhiloxM1 == 0xCD9E8D57u);
    CHECK(kPhiloxW0 == 0x9E3779B9u);
    CHECK(kPhiloxW1 == 0xBB67AE85u);
}

// The keep bits of the worked example of fa/philox.hpp (p = 0.5), as the map gives them.
constexpr uint32_t kDropoutExample = 0x7105u;

TEST_CASE("the dropout map: which counter and key words hold what, which byte decides, and the threshold") {
    // Key = the seed's two halves; counter = (4 (j / 32) + (j % 8) / 2, 8 (i / 16) + i % 8,
    // b * 2^16 + h, offset); byte 8 ((i % 16) / 8) + 2 ((j % 32) / 8) + j % 2 decides.
    const uint64_t seed = 0x0123456789abcdefull;
    const uint32_t offset = 77, batch = 3, head = 5, row = 1234;
    CHECK(dropout_key(seed).w[0] == 0x89abcdefu);
    CHECK(dropout_key(seed).w[1] == 0x01234567u);
    const PhiloxWords c = dropout_counter(offset, batch, head, row, 36);
    CHECK(c.w[0] == 6u);    // K = 1, q = (36 % 8) / 2 = 2
    CHECK(c.w[1] == 618u);  // I = 77, g = 1234 % 8 = 2
    CHECK(c.w[2] == ((3u << 16) | 5u));
    CHECK(c.w[3] == offset);
    // The 16 scores of that group: rows 1234 and 1242 (g and g + 8 of rows 1232..1247), columns
    // 36, 37, 44, 45, 52, 53, 60, 61 (2q, 2q + 1 of the four 8-column tiles of columns 32..63).
    for (uint32_t i : {1234u, 1242u})
        for (uint32_t j : {36u, 37u, 44u, 45u, 52u, 53u, 60u, 61u}) {
            const PhiloxWords cj = dropout_counter(offset, batch, head, i, j);
            for (int w = 0; w < 4; ++w) CHECK(cj.w[w] == c.w[w]);
        }
    std::set<uint32_t> bytes;
    for (uint32_t i : {1234u, 1242u})
        for (uint32_t j : {36u, 37u, 44u, 45u, 52u, 53u, 60u, 61u}) bytes.insert(dropout_byte(i, j));
    CHECK(bytes.size() == 16);  // each score of the group its own byte
    CHECK(dropout_byte(1234, 36) == 0u);
    CHECK(dropout_byte(1234, 37) == 1u);
    CHECK(dropout_byte(1234, 44) == 2u);
    CHECK(dropout_byte(1242, 61) == 15u);
    // Neighbours outside the group: another counter.
    CHECK(dropout_counter(offset, batch, head, 1235, 36).w[1] != c.w[1]);
    CHECK(dropout_counter(offset, batch, head, 1234, 38).w[0] != c.w[0]);
    CHECK(dropout_counter(offset, batch, head, 1234, 68).w[0] != c.w[0]);
    // The worked example of fa/philox.hpp's comment, pinned: a kernel must produce these bits.
    const PhiloxWords r = philox4x32_10(c, dropout_key(seed));
    const uint32_t example = dropout_keep16(seed, offset, batch, head, row, 36, dropout_threshold(0.5));
    for (uint32_t n = 0; n < 16; ++n) CHECK(((example >> n) & 1u) == uint32_t(((r.w[n / 4] >> (8 * (n % 4))) & 0xffu) >= 128u));
    CHECK(example == kDropoutExample);
    for (double p : {0.0, 0.1, 0.5, 0.9}) {
        const uint32_t t = dropout_threshold(p);
        for (uint32_t i : {1234u, 1242u})
            for (uint32_t j : {36u, 37u, 44u, 45u, 52u, 53u, 60u, 61u}) {
                const uint32_t n = dropout_byte(i, j);
                const bool want = ((r.w[n / 4] >> (8 * (n % 4))) & 0xffu) >= t;
                CHECK(dropout_keep(seed, offset, batch, head, i, j, p) == want);
            }
    }
    // t = round(256 p), half up: p runs as t / 256, and kept scores are scaled by 256 / (256 - t).
    CHECK(dropout_threshold(0.0) == 0u);
    CHECK(dropout_threshold(0.25) == 64u);
    CHECK(dropout_threshold(0.5) == 128u);
    CHECK(dropout_threshold(0.1) == 26u);  // 25.6
    CHECK(dropout_threshold(0.998) == 255u);
    CHECK(dropout_effective_p(0.1) == 26.0 / 256.0);
    CHECK(dropout_keep_scale(0.1) == 256.0 / 230.0);
    CHECK(dropout_keep_scale(0.0) == 1.0);
    for (uint32_t col = 0; col < 64; ++col) CHECK(dropout_keep(seed, 0, 0, 0, 0, col, 0.0));
    // What would drop everything is refused, naming the bound.
    VarlenProblem all = make_varlen({4}, {4}, 1, 1, 8);
    all.dropout = {0.999, 1, 0};
    CHECK(contains(error_of([&] { all.validate(); }), "below 255.5/256"));
    all.dropout.p = 0.998;
    all.validate();
    all.dropout.p = 0.1;
    CHECK(contains(all.describe(), "dropout=0.1 (runs as 26/256)"));
}

TEST_CASE("dropout_keep4: four bytes compared at once equal the byte-by-byte comparison, for every threshold") {
    // Every threshold t and every value of each byte, the other three bytes random, and the
    // boundaries (t - 1, t, t + 1 in all four bytes): bit k is 1 iff byte k >= t.
    std::mt19937 rng(20261126);
    for (uint32_t t = 0; t < 256; ++t) {
        const uint32_t t4 = t * 0x01010101u;
        const auto want = [t](uint32_t word) {
            uint32_t bits = 0;
            for (uint32_t k = 0; k < 4; ++k) bits |= uint32_t(((word >> (8 * k)) & 0xffu) >= t) << k;
            return bits;
        };
        int wrong = 0;
        for (uint32_t k = 0; k < 4; ++k)
            for (uint32_t byte = 0; byte < 256; ++byte) {
                const uint32_t word = (rng() & ~(0xffu << (8 * k))) | (byte << (8 * k));
                wrong += dropout_keep4(word, t4) != want(word);
            }
        for (uint32_t b : {t - 1, t, t + 1}) {
            const uint32_t word = (b & 0xffu) * 0x01010101u;
            wrong += dropout_keep4(word, t4) != want(word);
        }
        CHECK_MESSAGE(wrong == 0, "threshold " << t);
    }
    CHECK(dropout_keep4(0x00ff7f80u, 128u * 0x01010101u) == 0b0101u);  // bytes 0x80, 0x7f, 0xff, 0x00
    CHECK(dropout_keep4(0x12345678u, 0u) == 0xfu);                      // t = 0 keeps everything
}

TEST_CASE("dropout keeps 1 - p' of 10^6 entries to within 5 standard deviations, in each of the 16 bytes") {
    // 4 x 5 x 250 x 200 = 10^6 entries (b, h, i, j), 62500 Philox calls per p.
    const uint64_t seed = 20261123;
    for (double p : {0.01, 0.1, 0.3, 0.5, 0.9}) {
        const uint32_t t = dropout_threshold(p);
        const double pe = dropout_effective_p(p);
        int64_t kept[16] = {}, n = 0, agree_offset = 0, agree_seed = 0;
        for (uint32_t b = 0; b < 4; ++b)
            for (uint32_t h = 0; h < 5; ++h)
                for (uint32_t i = 0; i < 400; i += 16)  // row groups of 16 rows (8 counters each)
                    for (uint32_t g = 0; g < 8; ++g)
                        for (uint32_t j = 0; j < 256; j += 32)  // column groups of 32 columns (4 counters each)
                            for (uint32_t q = 0; q < 4; ++q) {
                                if (n >= 1000000) continue;
                                const uint32_t bits = dropout_keep16(seed, 0, b, h, i + g, j + 2 * q, t);
                                const uint32_t other_offset = dropout_keep16(seed, 1, b, h, i + g, j + 2 * q, t);
                                const uint32_t other_seed = dropout_keep16(seed + 1, 0, b, h, i + g, j + 2 * q, t);
                                for (int w = 0; w < 16; ++w) {
                                    kept[w] += (bits >> w) & 1u;
                                    agree_offset += ((bits ^ other_offset) >> w & 1u) == 0;
                                    agree_seed += ((bits ^ other_seed) >> w & 1u) == 0;
                                }
                                n += 16;
                            }
        REQUIRE(n == 1000000);
        int64_t total = 0;
        for (int64_t k : kept) total += k;
        const double sigma = std::sqrt(pe * (1 - pe) / double(n));
        INFO("p = " << p << " (runs as " << pe << "): kept " << total << " of " << n << ", rate " << double(total) / double(n)
                    << ", sigma " << sigma);
        CHECK(std::abs(double(total) / double(n) - (1 - pe)) <= 5 * sigma);
        for (int w = 0; w < 16; ++w) {  // each byte of the call on its own: n/16 draws
            INFO("byte " << w << ": kept " << kept[w]);
            CHECK(std::abs(double(kept[w]) / double(n / 16) - (1 - pe)) <= 5 * 4 * sigma);
        }
        // Another offset or seed gives an independent mask: two masks agree with probability
        // p'^2 + (1-p')^2.
        const double agree = pe * pe + (1 - pe) * (1 - pe), sigma_agree = std::sqrt(agree * (1 - agree) / double(n));
        CHECK(std::abs(double(agree_offset) / double(n) - agree) <= 5 * sigma_agree);
        CHECK(std::abs(double(agree_seed) / double(n) - agree) <= 5 * sigma_agree);
    }
}

TEST_CASE("the dropout keep mask: the same when regenerated, bit for bit the map, zero outside each sequence") {
    VarlenProblem p = make_varlen({5, 0, 17, 1}, {9, 3, 6, 0}, 3, 1, 8);
    p.dropout = {0.3, 99, 4};
    const int64_t Nq = p.max_seq_q(), Nk = p.max_seq_k(), H = p.heads_q;
    const std::vector<uint8_t> mask = dropout_keep_mask(p);
    REQUIRE(mask.size() == size_t(p.batch() * H * Nq * Nk));
    CHECK(mask == dropout_keep_mask(p));
    int64_t kept = 0, inside = 0;
    for (int64_t b = 0; b < p.batch(); ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < Nq; ++i)
                for (int64_t j = 0; j < Nk; ++j) {
                    const uint8_t m = mask[size_t(((b * H + h) * Nq + i) * Nk + j)];
                    if (i >= p.seq_q(b) || j >= p.seq_k(b)) {
                        CHECK(m == 0);  // padding
                        continue;
                    }
                    ++inside;
                    kept += m;
                    CHECK(m == uint8_t(dropout_keep(99, 4, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j), 0.3)));
                }
    CHECK(kept > 0);
    CHECK(kept < inside);
    // Another offset: another mask. Without dropout: every entry of each sequence's corner is 1.
    VarlenProblem shifted = p;
    shifted.dropout.offset = 5;
    CHECK(dropout_keep_mask(shifted) != mask);
    VarlenProblem none = p;
    none.dropout = {};
    const std::vector<uint8_t> all = dropout_keep_mask(none);
    CHECK(std::count(all.begin(), all.end(), uint8_t(1)) == inside);
    // Too large for --save: refused with the sizes.
    CHECK(contains(error_of([&] { dropout_keep_mask(p, 100); }), "dropout mask would hold"));
    // The .npy file holds the same bytes after its header.
    const std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/fa_test_stage10_dropout_mask.npy";
    write_dropout_mask_npy(path, p);
    std::ifstream in(path, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), {}};
    CHECK(contains(bytes, "'descr': '|u1', 'fortran_order': False, 'shape': (4, 3, 17, 9), }"));
    REQUIRE(bytes.size() >= mask.size());
    CHECK(bytes.substr(bytes.size() - mask.size()) == std::string(mask.begin(), mask.end()));
    std::remove(path.c_str());
}

// ==============================================================================================
// The packed problem

TEST_CASE("the packed problem: validation names what is wrong and what is allowed") {
    const VarlenProblem ok = make_varlen({3, 5}, {4, 6}, 6, 2, 8);
    CHECK_NOTHROW(ok.validate());
    const auto message = [&](const std::function<void(VarlenProblem&)>& change) {
        VarlenProblem p = ok;
        change(p);
        return error_of([&] { p.validate(); });
    };
    std::string m = message([](VarlenProblem& p) { p.heads_k = 4; });
    INFO(m);
    CHECK(contains(m, "--heads 6 is not a multiple of --kv-heads 4"));
    CHECK(contains(m, "1, 2, 3 or 6"));
    CHECK(contains(message([](VarlenProblem& p) { p.heads_k = 0; }), "--kv-heads is 0"));
    CHECK(contains(message([](VarlenProblem& p) { p.cu_seqlens_q = {0, 5, 3}; p.total_q = 3; }),
                   "cu_seqlens_q is not nondecreasing: entry 2 is 3 after entry 1 = 5"));
    CHECK(contains(message([](VarlenProblem& p) { p.total_q = 9; }), "cu_seqlens_q ends at 8 but total_q is 9"));
    CHECK(contains(message([](VarlenProblem& p) { p.cu_seqlens_k = {1, 4, 10}; }), "cu_seqlens_k[0] is 1"));
    CHECK(contains(message([](VarlenProblem& p) { p.cu_seqlens_k = {0, 10}; }), "both need B+1 entries"));
    CHECK(contains(message([](VarlenProblem& p) { p.cu_seqlens_q = {0}; p.total_q = 0; }), "it needs B+1 >= 2"));
    CHECK(contains(message([](VarlenProblem& p) { p.window = {-2, 0}; }), "--window left -2 is not allowed"));
    CHECK(contains(message([](VarlenProblem& p) { p.window = {4, -7}; }), "--window right -7 is not allowed"));
    CHECK(contains(message([](VarlenProblem& p) { p.dropout.p = 1.0; }), "--dropout 1 is outside [0, 1)"));
    CHECK(contains(message([](VarlenProblem& p) { p.dropout.p = -0.1; }), "--dropout -0.1 is outside [0, 1)"));
    CHECK(contains(message([](VarlenProblem& p) { p.dropout.p = std::nan(""); }), "is outside [0, 1)"));
    CHECK(contains(message([](VarlenProblem& p) { p.softcap = -1; }), "--softcap -1 is not allowed"));
    CHECK(contains(message([](VarlenProblem& p) { p.softcap = INFINITY; }), "--softcap inf is not allowed"));
    CHECK(contains(message([](VarlenProblem& p) { p.scale = NAN; }), "--scale"));
    CHECK(contains(message([](VarlenProblem& p) { p.heads_q = p.heads_k = 70000; p.dropout.p = 0.1; }),
                   "must both be at most 65536"));
    CHECK(contains(error_of([] { cu_seqlens_from_lengths({3, -1}); }), "sequence 1 has length -1"));

    // Tensors of the wrong shape are refused by the reference before anything is read.
    const Drawn t = draw(ok, 1);
    CHECK(contains(error_of([&] { reference_attention_varlen(ok, t.k(), t.k(), t.v()); }), "q has shape (1, 2, 10, 8)"));
    CHECK(contains(error_of([&] { reference_backward_varlen(ok, t.q(), t.k(), t.v(), t.k()); }), "dO has shape"));
}

TEST_CASE("the packed problem: lengths, windows as key ranges, uniform batches") {
    const VarlenProblem p = make_varlen({3, 0, 7}, {5, 2, 7}, 4, 2, 16);
    CHECK(p.batch() == 3);
    CHECK(p.seq_q(1) == 0);
    CHECK(p.seq_k(2) == 7);
    CHECK(p.max_seq_q() == 7);
    CHECK(p.max_seq_k() == 7);
    CHECK(p.group_size() == 2);
    CHECK(p.kv_head(3) == 1);
    CHECK(p.visible_pairs_per_head() == 3 * 5 + 7 * 7);
    CHECK(reference_varlen_flops(p) == 4.0 * (15 + 49) * 4 * 16);
    CHECK(contains(p.describe(), "seqlens_q=3,0,7 seqlens_k=5,2,7"));
    // Lengths differ when two sequences differ in queries or in keys (one sequence never does).
    CHECK(p.lengths_differ());
    CHECK_FALSE(make_varlen({4, 4}, {6, 6}, 1, 1, 8).lengths_differ());
    CHECK(make_varlen({4, 4}, {6, 5}, 1, 1, 8).lengths_differ());
    CHECK(make_varlen({4, 3}, {6, 6}, 1, 1, 8).lengths_differ());
    CHECK_FALSE(make_varlen({9}, {2}, 1, 1, 8).lengths_differ());

    // The key range of every row is the explicit window predicate, for windows narrower than a
    // row and wider than the sequence, causal and not, Nq < Nk and Nq > Nk.
    const Window windows[] = {Window::full(), Window::causal(), {0, 0}, {3, 5}, {2, -1}, {-1, 4}, {1000, 1000}, {0, 1000}};
    const int64_t sizes[][2] = {{1, 1}, {7, 7}, {5, 13}, {13, 5}, {0, 4}, {4, 0}};
    for (const Window& w : windows)
        for (const auto& s : sizes)
            for (int64_t i = 0; i < s[0]; ++i) {
                const KeyRange keys = visible_key_range(i, s[0], s[1], w);
                for (int64_t j = 0; j < s[1]; ++j) {
                    INFO("window (" << w.left << "," << w.right << ") Nq=" << s[0] << " Nk=" << s[1] << " i=" << i << " j=" << j);
                    CHECK((j >= keys.begin && j < keys.end) == in_window(i, j, s[0], s[1], w));
                }
                if (w.left == -1 && w.right == 0) CHECK(keys.end == visible_key_end(i, s[0], s[1], true));
            }

    // A uniform batch as a packed problem.
    Problem u;
    u.batch = 3;
    u.heads = 2;
    u.seq_q = 5;
    u.seq_k = 9;
    u.head_dim = 4;
    u.causal = true;
    const VarlenProblem v = varlen_from(u);
    CHECK(v.cu_seqlens_q == std::vector<int32_t>{0, 5, 10, 15});
    CHECK(v.cu_seqlens_k == std::vector<int32_t>{0, 9, 18, 27});
    CHECK(v.window.left == -1);
    CHECK(v.window.right == 0);
    CHECK(v.visible_pairs_per_head() == u.batch * u.visible_pairs_per_head());
}

// ==============================================================================================
// The extended reference against the plain one and against itself

TEST_CASE("with no new feature the extended reference is reference_attention and reference_backward, bit for bit") {
    struct Case {
        Problem problem;
        uint64_t seed;
    };
    const auto make = [](int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t d, bool causal) {
        Problem p;
        p.batch = B, p.heads = H, p.seq_q = Nq, p.seq_k = Nk, p.head_dim = d, p.causal = causal;
        return p;
    };
    Problem scaled = make(2, 2, 61, 67, 16, false);
    scaled.scale = 0.3;
    const Case cases[] = {{make(2, 3, 150, 170, 16, false), 1}, {make(1, 2, 170, 150, 8, true), 2},
                          {make(3, 1, 1, 1, 4, false), 3},       {make(2, 2, 200, 129, 32, true), 4},
                          {make(1, 1, 37, 300, 8, true), 5},      {scaled, 6}};
    for (const Case& c : cases) {
        const Problem& p = c.problem;
        INFO(p.describe() << " seed=" << c.seed);
        // BNHD inputs: their (B, N, H, d) buffers are the packed (B N, H, d) tensors.
        const Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, c.seed);
        const HostTensor dout = make_output_gradient(p, Layout::BNHD, c.seed);
        const VarlenProblem vp = varlen_from(p);
        const auto packed = [](const HostTensor& t, int64_t rows, int64_t heads, int64_t d) {
            return make_packed_view(t.storage.data(), rows, heads, d);
        };
        const View4<const float> q = packed(in.q, vp.total_q, p.heads, p.head_dim), k = packed(in.k, vp.total_k, p.heads, p.head_dim),
                                 v = packed(in.v, vp.total_k, p.heads, p.head_dim), d = packed(dout, vp.total_q, p.heads, p.head_dim);

        const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
        const ReferenceGradients grad = reference_backward(p, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
        const auto check_all = [&](const VarlenProblem& ext_problem) {
            const VarlenReference ext = reference_attention_varlen(ext_problem, q, k, v);
            const VarlenGradients eg = reference_backward_varlen(ext_problem, q, k, v, d);
            int64_t o_diff = 0, lse_diff = 0, dq_diff = 0, dk_diff = 0, dv_diff = 0;
            const int64_t H = p.heads, D = p.head_dim;
            for (int64_t b = 0; b < p.batch; ++b)
                for (int64_t h = 0; h < H; ++h) {
                    for (int64_t n = 0; n < p.seq_q; ++n) {
                        const int64_t t = b * p.seq_q + n;  // packed row
                        const double l_ref = ref.lse[size_t((b * H + h) * p.seq_q + n)], l_ext = ext.lse[size_t(h * vp.total_q + t)];
                        lse_diff += !(l_ref == l_ext);
                        for (int64_t x = 0; x < D; ++x) {
                            const size_t logical = size_t(((b * H + h) * p.seq_q + n) * D + x), pk = size_t((t * H + h) * D + x);
                            o_diff += ref.o[logical] != ext.o[pk];
                            dq_diff += grad.dq[logical] != eg.dq[pk];
                        }
                    }
                    for (int64_t n = 0; n < p.seq_k; ++n)
                        for (int64_t x = 0; x < D; ++x) {
                            const size_t logical = size_t(((b * H + h) * p.seq_k + n) * D + x),
                                         pk = size_t(((b * p.seq_k + n) * H + h) * D + x);
                            dk_diff += grad.dk[logical] != eg.dk[pk];
                            dv_diff += grad.dv[logical] != eg.dv[pk];
                        }
                }
            CHECK(o_diff == 0);
            CHECK(lse_diff == 0);
            CHECK(dq_diff == 0);
            CHECK(dk_diff == 0);
            CHECK(dv_diff == 0);
        };
        check_all(vp);
        // A window wider than both sequences on its open sides is the same mask, so the same sums.
        VarlenProblem wide = vp;
        wide.window = {p.seq_k + 5, p.causal ? 0 : p.seq_q + 5};
        check_all(wide);
    }
}

TEST_CASE("grouped-query heads equal the reference with K and V repeated per query head, dK and dV summed over the group") {
    for (int64_t Hk : {1, 2, 3}) {  // MQA, GQA with groups of 3, groups of 2
        const int64_t Hq = 6, G = Hq / Hk, d = 8;
        VarlenProblem p = make_varlen({7, 0, 131, 1}, {9, 4, 140, 1}, Hq, Hk, d);
        p.window = {20, 3};
        p.softcap = 2.5;
        p.dropout = {0.2, 7, 1};
        INFO(p.describe());
        const Drawn t = draw(p, 50 + uint64_t(Hk));
        // The same K and V copied to every query head of the group: plain multi-head attention.
        VarlenProblem rp = p;
        rp.heads_k = Hq;
        Drawn rep{{t.in.q, HostTensor(1, Hq, p.total_k, d, Layout::BNHD), HostTensor(1, Hq, p.total_k, d, Layout::BNHD)}, t.dout};
        for (int64_t n = 0; n < p.total_k; ++n)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t x = 0; x < d; ++x) {
                    rep.in.k.view(0, h, n, x) = t.in.k.view(0, h / G, n, x);
                    rep.in.v.view(0, h, n, x) = t.in.v.view(0, h / G, n, x);
                }
        const VarlenReference a = forward(p, t), b = forward(rp, rep);
        CHECK(a.o == b.o);  // the same products on the same values: exact
        CHECK(a.lse == b.lse);
        const VarlenGradients ga = backward(p, t), gb = backward(rp, rep);
        CHECK(ga.dq == gb.dq);
        std::vector<double> dk(ga.dk.size(), 0.0), dv(ga.dv.size(), 0.0);  // gb's dK, dV summed over each group
        for (int64_t n = 0; n < p.total_k; ++n)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t x = 0; x < d; ++x) {
                    dk[size_t((n * Hk + h / G) * d + x)] += gb.dk[size_t((n * Hq + h) * d + x)];
                    dv[size_t((n * Hk + h / G) * d + x)] += gb.dv[size_t((n * Hq + h) * d + x)];
                }
        check_close("dK", ga.dk, dk, 1e-13);  // the same terms summed in another order
        check_close("dV", ga.dv, dv, 1e-13);
        CHECK(max_abs(ga.dk) > 0);
    }
}

TEST_CASE("a packed batch equals each sequence run alone") {
    // Lengths 0, 1, primes, one past a 128-row block; Nq < Nk and Nq > Nk within one batch.
    const std::vector<int64_t> lq = {0, 1, 13, 131, 7, 1, 5}, lk = {3, 1, 17, 2, 0, 29, 5};
    for (const Window w : {Window::full(), Window::causal(), Window{4, 2}}) {
        VarlenProblem p = make_varlen(lq, lk, 4, 2, 8);
        p.window = w;
        p.softcap = w.left == 4 ? 1.5 : 0.0;
        INFO(p.describe());
        const Drawn t = draw(p, 60);
        const VarlenReference all = forward(p, t);
        const VarlenGradients grad = backward(p, t);
        for (int64_t b = 0; b < p.batch(); ++b) {
            INFO("sequence " << b << ": Nq=" << p.seq_q(b) << " Nk=" << p.seq_k(b));
            const int64_t Nq = p.seq_q(b), Nk = p.seq_k(b), q0 = p.cu_seqlens_q[size_t(b)], k0 = p.cu_seqlens_k[size_t(b)];
            VarlenProblem one = make_varlen({Nq}, {Nk}, p.heads_q, p.heads_k, p.head_dim);
            one.window = p.window;
            one.softcap = p.softcap;
            // Views of the sequence's rows inside the packed buffers: no copy.
            const auto rows = [](const HostTensor& x, int64_t row0, int64_t n) {
                View4<const float> view = x.cview();
                view.data += row0 * view.stride[2];
                view.shape[2] = n;
                return view;
            };
            const View4<const float> q = rows(t.in.q, q0, Nq), k = rows(t.in.k, k0, Nk), v = rows(t.in.v, k0, Nk),
                                     d = rows(t.dout, q0, Nq);
            const VarlenReference alone = reference_attention_varlen(one, q, k, v);
            const VarlenGradients galone = reference_backward_varlen(one, q, k, v, d);
            const int64_t Hq = p.heads_q, Hk = p.heads_k, D = p.head_dim;
            const auto slice = [](const std::vector<double>& x, int64_t row0, int64_t n, int64_t width) {
                return std::vector<double>(x.begin() + row0 * width, x.begin() + (row0 + n) * width);
            };
            CHECK(slice(all.o, q0, Nq, Hq * D) == alone.o);
            CHECK(slice(grad.dq, q0, Nq, Hq * D) == galone.dq);
            CHECK(slice(grad.dk, k0, Nk, Hk * D) == galone.dk);
            CHECK(slice(grad.dv, k0, Nk, Hk * D) == galone.dv);
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t i = 0; i < Nq; ++i) CHECK(all.lse[size_t(h * p.total_q + q0 + i)] == alone.lse[size_t(h * Nq + i)]);

            // Without window or cap, a sequence that has queries and keys is also the plain reference.
            if (w.is_full() && Nq > 0 && Nk > 0) {
                Problem plain;
                plain.batch = 1, plain.heads = Hq, plain.seq_q = Nq, plain.seq_k = Nk, plain.head_dim = D;
                // The plain reference has Hq = Hk: K and V repeated for each query head of a group.
                HostTensor kr(1, Hq, Nk, D, Layout::BNHD), vr(1, Hq, Nk, D, Layout::BNHD);
                for (int64_t n = 0; n < Nk; ++n)
                    for (int64_t h = 0; h < Hq; ++h)
                        for (int64_t x = 0; x < D; ++x) {
                            kr.view(0, h, n, x) = k(0, h / 2, n, x);
                            vr.view(0, h, n, x) = v(0, h / 2, n, x);
                        }
                const Reference ref = reference_attention(plain, q, kr.cview(), vr.cview());
                for (int64_t h = 0; h < Hq; ++h)
                    for (int64_t i = 0; i < Nq; ++i)
                        for (int64_t x = 0; x < D; ++x)
                            CHECK(ref.o[size_t((h * Nq + i) * D + x)] == alone.o[size_t((i * Hq + h) * D + x)]);
            }
        }
    }
}

TEST_CASE("the extended reference reads through the views: packed (total, H, d) and (H, total, d) agree exactly") {
    VarlenProblem p = make_varlen({5, 0, 131, 2}, {7, 3, 130, 1}, 4, 2, 8);
    p.window = {9, 2};
    p.softcap = 5.0;
    p.dropout = {0.15, 21, 0};
    INFO(p.describe());
    const Drawn a = draw(p, 65);
    // The same logical tensors stored head-major, (H, total, d): only the strides change.
    const auto head_major = [](const HostTensor& t) {
        HostTensor out(1, t.view.shape[1], t.view.shape[2], t.view.shape[3], Layout::BHND);
        for (int64_t h = 0; h < t.view.shape[1]; ++h)
            for (int64_t n = 0; n < t.view.shape[2]; ++n)
                for (int64_t x = 0; x < t.view.shape[3]; ++x) out.view(0, h, n, x) = t.view(0, h, n, x);
        return out;
    };
    const Drawn b{{head_major(a.in.q), head_major(a.in.k), head_major(a.in.v)}, head_major(a.dout)};
    REQUIRE(a.in.q.storage != b.in.q.storage);
    const VarlenReference fa_ = forward(p, a), fb = forward(p, b);
    const VarlenGradients ga = backward(p, a), gb = backward(p, b);
    check_identical(fa_, ga, fb, gb);
}

// ==============================================================================================
// Against plain loops: windows, the soft cap, dropout

TEST_CASE("windows narrower than a tile and wider than N equal an explicit mask; the soft cap equals its formula") {
    struct Case {
        Window window;
        double softcap;
    };
    const Case cases[] = {{{3, 5}, 0}, {{0, 0}, 0}, {{7, -1}, 0}, {{-1, 2}, 0}, {{300, 1000}, 0},
                          {Window::causal(), 0}, {Window::full(), 1.0}, {{5, 0}, 0.5}, {{3, 5}, 30.0}};
    for (const Case& c : cases) {
        VarlenProblem p = make_varlen({200, 1, 61, 17}, {190, 13, 67, 3}, 2, 1, 16);
        p.window = c.window;
        p.softcap = c.softcap;
        INFO(p.describe());
        const Drawn t = draw(p, 70, c.softcap == 30.0 ? InputKind::Large : InputKind::Normal);
        const VarlenReference ext = forward(p, t);
        const Naive naive = naive_forward(p, dense(t), nullptr);
        check_close("O", ext.o, naive.o, 1e-12);
        check_close("LSE", ext.lse, naive.lse, 1e-12);
        CHECK(nonfinite_count(ext.o) == 0);
        CHECK(nonfinite_count(ext.lse, true) == 0);
    }
    // A very large cap is no cap (c tanh(s/c) = s - s^3/(3c^2) + ...).
    VarlenProblem p = make_varlen({40}, {50}, 1, 1, 8), capped = p;
    capped.softcap = 1e6;
    const Drawn t = draw(p, 71);
    check_close("O, cap 1e6", forward(capped, t).o, forward(p, t).o, 1e-10);
}

TEST_CASE("fully masked rows: O = 0, LSE = -inf, zero gradients, never NaN") {
    // Sequence 0: causal with Nq > Nk (rows 0..5 see nothing); 1: no keys at all; 2: no queries;
    // 3: window (0, 0) with Nq < Nk, so keys 0..5 are seen by no query.
    for (const Window w : {Window::causal(), Window{0, 0}}) {
        VarlenProblem p = make_varlen({9, 4, 0, 3}, {3, 0, 5, 9}, 2, 1, 4);
        p.window = w;
        p.dropout = {0.25, 3, 0};
        p.softcap = 3.0;
        INFO(p.describe());
        const Drawn t = draw(p, 80, InputKind::Large);
        const VarlenReference f = forward(p, t);
        const VarlenGradients g = backward(p, t);
        CHECK(nonfinite_count(f.o) == 0);
        CHECK(nonfinite_count(f.lse, true) == 0);
        CHECK(nonfinite_count(g.dq) == 0);
        CHECK(nonfinite_count(g.dk) == 0);
        CHECK(nonfinite_count(g.dv) == 0);
        int64_t empty_rows = 0;
        for (int64_t b = 0; b < p.batch(); ++b)
            for (int64_t h = 0; h < p.heads_q; ++h)
                for (int64_t i = 0; i < p.seq_q(b); ++i) {
                    if (!visible_key_range(i, p.seq_q(b), p.seq_k(b), p.window).empty()) continue;
                    ++empty_rows;
                    const int64_t row = p.cu_seqlens_q[size_t(b)] + i;
                    CHECK(f.lse[size_t(h * p.total_q + row)] == -std::numeric_limits<double>::infinity());
                    for (int64_t x = 0; x < p.head_dim; ++x) {
                        CHECK(f.o[size_t((row * p.heads_q + h) * p.head_dim + x)] == 0.0);
                        CHECK(g.dq[size_t((row * p.heads_q + h) * p.head_dim + x)] == 0.0);
                    }
                }
        // Causal: 6 rows of sequence 0 and all 4 of sequence 1, in both heads. Window (0, 0): the
        // same 6 + 4 (row i sees only key i - 6 in sequence 0).
        CHECK(empty_rows == 2 * (6 + 4));
        // Keys no query sees: all of sequence 2's; under (0, 0) also keys 0..5 of sequence 3.
        const auto key_row_zero = [&](int64_t row) {
            bool zero = true;
            for (int64_t x = 0; x < p.head_dim; ++x)
                zero = zero && g.dk[size_t(row * p.head_dim + x)] == 0.0 && g.dv[size_t(row * p.head_dim + x)] == 0.0;
            return zero;
        };
        for (int64_t j = 0; j < 5; ++j) CHECK(key_row_zero(p.cu_seqlens_k[2] + j));
        if (w.right == 0 && w.left == 0)
            for (int64_t j = 0; j < 6; ++j) CHECK(key_row_zero(p.cu_seqlens_k[3] + j));
        CHECK(!key_row_zero(p.cu_seqlens_k[3] + 8));
    }
}

TEST_CASE("dropout: the reference given the mask is attention with dropped P zeroed and the rest scaled; p = 0 is no dropout") {
    VarlenProblem p = make_varlen({33, 1, 140, 6}, {40, 7, 129, 2}, 4, 2, 8);
    p.window = {50, 10};
    p.softcap = 4.0;
    const Drawn t = draw(p, 90);
    const VarlenReference plain = forward(p, t);
    const VarlenGradients gplain = backward(p, t);
    for (double prob : {0.1, 0.5, 0.9}) {
        VarlenProblem dp = p;
        dp.dropout = {prob, 1234, 2};
        INFO(dp.describe());
        const std::vector<uint8_t> mask = dropout_keep_mask(dp);
        const VarlenReference ext = forward(dp, t);
        const Naive naive = naive_forward(dp, dense(t), &mask);
        check_close("O", ext.o, naive.o, 1e-12);
        CHECK(ext.lse == plain.lse);  // the LSE is that of the scores before dropout
        CHECK(max_abs_diff(ext.o, plain.o) > 1e-3);  // and dropout did change O
    }
    // p = 0 with any seed and offset: exactly no dropout, forward and backward.
    VarlenProblem zero = p;
    zero.dropout = {0.0, 555, 9};
    const VarlenReference f0 = forward(zero, t);
    const VarlenGradients g0 = backward(zero, t);
    check_identical(f0, g0, plain, gplain);
}

TEST_CASE("the backward matches central finite differences with every feature on") {
    struct Case {
        std::vector<int64_t> lq, lk;
        int64_t Hq, Hk, d;
        Window window;
        double softcap;
        Dropout dropout;
        uint64_t seed;
    };
    const Case cases[] = {
        // varlen with empty sequences, GQA, a window, the cap, dropout: all at once
        {{3, 0, 4, 1, 2}, {4, 2, 3, 1, 0}, 4, 2, 3, {2, 1}, 0.7, {0.3, 42, 3}, 11},
        // causal with Nq > Nk (rows without keys), MQA, heavy dropout
        {{5, 2}, {3, 6}, 3, 1, 2, Window::causal(), 0.0, {0.5, 7, 0}, 12},
        // the cap alone, small enough that tanh bends on scores of order 1
        {{4, 3}, {5, 3}, 2, 2, 4, Window::full(), 0.4, {}, 13},
        // a one-sided window, Nq < Nk
        {{2, 6}, {7, 6}, 2, 1, 3, {1, -1}, 1.2, {0.2, 99, 5}, 14},
    };
    for (const Case& c : cases) {
        VarlenProblem p = make_varlen(c.lq, c.lk, c.Hq, c.Hk, c.d);
        p.window = c.window;
        p.softcap = c.softcap;
        p.dropout = c.dropout;
        INFO(p.describe() << " seed=" << c.seed);
        const Drawn t = draw(p, c.seed);
        const Dense x = dense(t);
        const std::vector<uint8_t> mask = dropout_keep_mask(p);
        const std::vector<uint8_t>* keep = p.dropout.enabled() ? &mask : nullptr;
        // The loops and the reference compute the same forward.
        const Naive naive = naive_forward(p, x, keep);
        check_close("O", forward(p, t).o, naive.o, 1e-12);
        const VarlenGradients g = backward(p, t);
        check_close("dQ", g.dq, numerical_gradient(p, x, &Dense::q, keep), 1e-6);
        check_close("dK", g.dk, numerical_gradient(p, x, &Dense::k, keep), 1e-6);
        check_close("dV", g.dv, numerical_gradient(p, x, &Dense::v, keep), 1e-6);
        CHECK(max_abs(g.dq) > 0);
        CHECK(max_abs(g.dk) > 0);
        CHECK(max_abs(g.dv) > 0);
    }
}

// ==============================================================================================
// unpad / pad and the .npy writers

TEST_CASE("unpad and pad: gathers through one index list, any padding pattern, the inverse on real tokens") {
    const int64_t B = 3, N = 7, H = 2, d = 3;
    // Right padding, left padding with a hole, an empty sequence.
    const std::vector<uint8_t> mask = {1, 1, 1, 1, 0, 0, 0,  //
                                       0, 0, 1, 1, 0, 1, 1,  //
                                       0, 0, 0, 0, 0, 0, 0};
    const PackedIndex index = packed_index_from_mask(mask, B, N);
    CHECK(index.total() == 8);
    CHECK(index.cu_seqlens == std::vector<int32_t>{0, 4, 8, 8});
    CHECK(index.max_seqlen == 4);
    CHECK(index.indices == std::vector<int64_t>{0, 1, 2, 3, 9, 10, 12, 13});

    HostTensor padded(B, H, N, d, Layout::BNHD);  // the (B, N, H, d) buffer a model holds
    for (size_t n = 0; n < padded.storage.size(); ++n) padded.storage[n] = 1.0f + float(n);
    const HostTensor packed = unpad(padded.cview(), index);
    CHECK(packed.view.shape == std::array<int64_t, 4>{1, H, 8, d});
    for (int64_t t = 0; t < index.total(); ++t)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t x = 0; x < d; ++x)
                CHECK(packed.view(0, h, t, x) == padded.view(index.indices[size_t(t)] / N, h, index.indices[size_t(t)] % N, x));
    for (Layout layout : {Layout::BNHD, Layout::BHND}) {
        const HostTensor back = pad(packed.cview(), index, layout);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t n = 0; n < N; ++n)
                for (int64_t h = 0; h < H; ++h)
                    for (int64_t x = 0; x < d; ++x)
                        CHECK(back.view(b, h, n, x) == (mask[size_t(b * N + n)] ? padded.view(b, h, n, x) : 0.0f));
    }

    // Lengths describe right padding: the same packing as the prefix mask.
    const PackedIndex by_lengths = packed_index_from_lengths({4, 0, 7}, N);
    std::vector<uint8_t> prefix(size_t(B * N), 0);
    for (int64_t n = 0; n < 4; ++n) prefix[size_t(n)] = 1;
    for (int64_t n = 0; n < 7; ++n) prefix[size_t(2 * N + n)] = 1;
    const PackedIndex by_mask = packed_index_from_mask(prefix, B, N);
    CHECK(by_lengths.indices == by_mask.indices);
    CHECK(by_lengths.cu_seqlens == by_mask.cu_seqlens);
    CHECK(by_lengths.max_seqlen == 7);

    // Attention on the packed real tokens is each sequence's attention on its own tokens.
    const HostTensor packed_q = unpad(padded.cview(), by_lengths);
    VarlenProblem p = make_varlen({4, 0, 7}, {4, 0, 7}, H, H, d);
    REQUIRE(p.cu_seqlens_q == by_lengths.cu_seqlens);
    CHECK_NOTHROW(reference_attention_varlen(p, packed_q.cview(), packed_q.cview(), packed_q.cview()));

    CHECK(contains(error_of([] { packed_index_from_lengths({3, 9}, 7); }), "sequence 1 has length 9: lengths must lie in [0, N]"));
    CHECK(contains(error_of([] { packed_index_from_mask({1, 0, 1}, 2, 2); }), "the padding mask holds 3 entries"));
    CHECK(contains(error_of([&] { unpad(packed.cview(), index); }), "the padded tensor has shape"));
}

TEST_CASE(".npy writers for uint8 masks and int32 cu_seqlens") {
    const auto read_bytes = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    const std::string mask_path = dir + "/fa_test_stage10_mask.npy", cu_path = dir + "/fa_test_stage10_cu.npy";
    const std::vector<uint8_t> mask = {1, 0, 1, 1, 0, 1};
    write_npy(mask_path, {1, 2, 3}, mask);
    std::string bytes = read_bytes(mask_path);
    REQUIRE(bytes.size() >= 64 + mask.size());
    CHECK(bytes.compare(0, 6, "\x93NUMPY") == 0);
    CHECK(contains(bytes, "'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }"));
    CHECK((bytes.size() - mask.size()) % 64 == 0);  // data on a 64-byte boundary
    CHECK(bytes.substr(bytes.size() - mask.size()) == std::string(mask.begin(), mask.end()));

    const std::vector<int32_t> cu = {0, 5, 5, 300000};
    write_npy(cu_path, {4}, cu);
    bytes = read_bytes(cu_path);
    CHECK(contains(bytes, "'descr': '<i4', 'fortran_order': False, 'shape': (4, ), }"));
    REQUIRE(bytes.size() >= 16);
    const std::string tail = bytes.substr(bytes.size() - 16);
    for (size_t n = 0; n < cu.size(); ++n) {
        int32_t value = 0;
        std::memcpy(&value, tail.data() + 4 * n, 4);
        CHECK(value == cu[n]);
    }
    std::remove(mask_path.c_str());
    std::remove(cu_path.c_str());
}
