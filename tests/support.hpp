// Helpers shared by the stage tests: the standard cases of COURSE.md and one checking routine.
#pragma once

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fa/error.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/stage.hpp"
#include "fa/tolerance.hpp"

namespace fa::test {

/// A fresh directory for the files of one test (.npy inputs), removed at its end.
struct TempDir {
    std::filesystem::path path;  ///< the directory
    TempDir() {
        path = std::filesystem::temp_directory_path() / ("fa_test_" + std::to_string(std::random_device{}()));
        std::filesystem::create_directories(path);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    TempDir(const TempDir&) = delete;             ///< one owner of the directory
    TempDir& operator=(const TempDir&) = delete;  ///< one owner of the directory
    /// The path of `name` inside the directory.
    std::string file(const std::string& name) const { return (path / name).string(); }
};

/// One problem to check: shape, options and how the inputs are drawn.
struct Case {
    Problem problem;          ///< sizes, scale, causality
    Layout layout = Layout::BHND;
    InputKind inputs = InputKind::Normal;
    uint64_t seed = 1;
    std::string name() const {
        std::ostringstream s;
        s << problem.describe() << " layout=" << to_string(layout) << " inputs=" << to_string(inputs) << " seed=" << seed;
        return s.str();
    }
};

inline Problem make_problem(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t d, bool causal = false) {
    Problem p;
    p.batch = B;
    p.heads = H;
    p.seq_q = Nq;
    p.seq_k = Nk;
    p.head_dim = d;
    p.causal = causal;
    return p;
}

/// The cases every stage covers (COURSE.md): N = 1, primes, sizes no block divides, Nq != Nk,
/// causal with rows that see no key (Nq > Nk), large magnitudes, both layouts, d from 1 up to
/// `max_d` (only values in `allowed_d` when it is non-empty), LSE as well as O.
inline std::vector<Case> standard_cases(const std::vector<int64_t>& head_dims) {
    std::vector<Case> cases;
    uint64_t seed = 100;
    const int64_t sizes[][2] = {{1, 1}, {1, 37}, {37, 1}, {13, 13}, {61, 67}, {97, 131}, {130, 70}, {200, 129}, {255, 257}};
    for (int64_t d : head_dims) {
        for (const auto& s : sizes) {
            for (bool causal : {false, true}) {
                Case c;
                c.problem = make_problem(1, 2, s[0], s[1], d, causal);
                c.layout = (seed % 2) ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                cases.push_back(c);
            }
        }
        // Batch and heads > 1 with the flash-attn layout; a custom scale.
        Case bh;
        bh.problem = make_problem(2, 3, 45, 83, d, true);
        bh.problem.scale = 0.3;
        bh.layout = Layout::BNHD;
        bh.seed = seed++;
        cases.push_back(bh);
        // Large magnitudes: scores of order 400 (fa::InputKind::Large).
        for (bool causal : {false, true}) {
            Case big;
            big.problem = make_problem(1, 2, 70, 90, d, causal);
            big.inputs = InputKind::Large;
            big.seed = seed++;
            cases.push_back(big);
        }
    }
    return cases;
}

/// One row of a test's own table of cases: sizes, causality, layout, how the inputs are drawn and
/// the scale (unset: 1/sqrt(d)).
struct CaseShape {
    int64_t B, H, nq, nk;
    bool causal;
    Layout layout;
    InputKind inputs;
    std::optional<double> scale;
};

/// The cases of `shapes` at head dimension `d`, in order, seeded `first_seed`, `first_seed` + 1, ...
inline std::vector<Case> cases_of(const std::vector<CaseShape>& shapes, int64_t d, uint64_t first_seed) {
    std::vector<Case> all;
    uint64_t seed = first_seed;
    for (const CaseShape& s : shapes) {
        Case c;
        c.problem = make_problem(s.B, s.H, s.nq, s.nk, d, s.causal);
        c.problem.scale = s.scale;
        c.layout = s.layout;
        c.inputs = s.inputs;
        c.seed = seed++;
        all.push_back(c);
    }
    return all;
}

/// Causal cases (B = 1, H = 2) of each (Nq, Nk) in `sizes` at each head dimension of `head_dims`,
/// so that the diagonal falls at every offset against a kernel's tiles; the layout alternates with
/// the seed (`first_seed`, `first_seed` + 1, ...).
inline std::vector<Case> diagonal_cases(const std::vector<std::array<int64_t, 2>>& sizes, const std::vector<int64_t>& head_dims,
                                        uint64_t first_seed) {
    std::vector<Case> all;
    uint64_t seed = first_seed;
    for (int64_t d : head_dims) {
        for (const auto& s : sizes) {
            Case c;
            c.problem = make_problem(1, 2, s[0], s[1], d, true);
            c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
            c.seed = seed++;
            all.push_back(c);
        }
    }
    return all;
}

/// Scales a kernel must take as well as the default: negative, zero and large, each without and
/// with the causal mask (B = 1, H = 2, Nq = 150, Nk = 170, d = 64), seeded `first_seed`, `first_seed` + 1, ...
inline std::vector<Case> scale_cases(uint64_t first_seed) {
    std::vector<Case> all;
    uint64_t seed = first_seed;
    for (double scale : {-0.3, 0.0, 2.0}) {
        for (bool causal : {false, true}) {
            Case c;
            c.problem = make_problem(1, 2, 150, 170, 64, causal);
            c.problem.scale = scale;
            c.seed = seed++;
            all.push_back(c);
        }
    }
    return all;
}

/// Output of one run, in logical order.
struct Result {
    std::vector<float> o;    ///< (B, H, Nq, d)
    std::vector<float> lse;  ///< (B, H, Nq)
};

/// Runs `fn` on `in` with outputs poisoned with NaN, so unwritten elements fail.
inline Result run(const AttentionFn& fn, const Problem& p, const Inputs& in, Layout layout) {
    HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, layout, std::nanf(""));
    std::vector<float> lse(static_cast<size_t>(p.lse_elems()), std::nanf(""));
    fn(p, in.q.cview(), in.k.cview(), in.v.cview(), o.view, make_view3(lse.data(), p.batch, p.heads, p.seq_q));
    return {o.logical(), lse};
}

/// Checks the contract for rows that see no key on a run of `p`: every element was written (the
/// outputs start as NaN), a row whose visible keys are none has O = 0 and LSE = -inf, every other
/// row a finite LSE.
inline void check_rows_without_keys(const Problem& p, const Result& got) {
    for (float x : got.o) REQUIRE(std::isfinite(x));
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
        for (int64_t i = 0; i < p.seq_q; ++i) {
            const size_t row = size_t(bh * p.seq_q + i);
            const float lse = got.lse[row];
            if (visible_key_end(i, p.seq_q, p.seq_k, p.causal) == 0) {
                CHECK((std::isinf(lse) && lse < 0));
                for (int64_t x = 0; x < p.head_dim; ++x) CHECK(got.o[row * size_t(p.head_dim) + size_t(x)] == 0.0f);
            } else {
                CHECK(std::isfinite(lse));
            }
        }
    }
}

/// The float32 limits for these inputs (fa::rounding_tolerance(), the rule every stage uses).
inline Tolerances tolerances_for(const Problem& p, const Inputs& in) {
    return rounding_tolerance(input_stats(p, in.q.cview(), in.k.cview(), in.v.cview()));
}

/// Checks `got` against a reference within `tol`.
template <class Ref>
void check_close(const Result& got, const Ref& ref_o, const Ref& ref_lse, const Tolerances& tol, const std::string& what) {
    const Metrics mo = compare(got.o, ref_o);
    const Metrics ml = compare(got.lse, ref_lse);
    INFO(what);
    INFO("O: max_abs=" << mo.max_abs << " rel_l2=" << mo.rel_l2 << " nonfinite=" << mo.nonfinite << " (limits "
                       << tol.o.max_abs << ", " << tol.o.rel_l2 << ")");
    INFO("LSE: max_abs=" << ml.max_abs << " nonfinite=" << ml.nonfinite << " (limit " << tol.lse.max_abs << ")");
    INFO(tol.rule);
    CHECK(passes(mo, tol.o));
    CHECK(passes(ml, tol.lse));
}

/// Checks `fn` against the float64 reference on `c`; also checks the no-visible-key contract.
inline Result check_against_reference(const AttentionFn& fn, const Case& c) {
    const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
    const Result got = run(fn, c.problem, in, c.layout);
    const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
    check_close(got, ref.o, ref.lse, tolerances_for(c.problem, in), c.name() + " vs float64 reference");
    return got;
}

/// Checks `fn` against another stage `prev` on `c`.
inline void check_against_stage(const AttentionFn& fn, const AttentionFn& prev, const Case& c, const std::string& prev_name) {
    const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
    const Result got = run(fn, c.problem, in, c.layout);
    const Result want = run(prev, c.problem, in, c.layout);
    check_close(got, want.o, want.lse, tolerances_for(c.problem, in), c.name() + " vs " + prev_name);
}

/// The message of the fa::InputError `f` throws ("" if it throws none).
template <class F>
std::string refusal(F&& f) {
    try {
        f();
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

}  // namespace fa::test
