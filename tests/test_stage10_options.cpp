// Tests of stage 10's host half (stages/10_real_models/options.hpp): the parse of --seqlens and
// --window, the packed problem the options describe and every refusal of it, --load of packed
// .npy files (shapes, cu_seqlens in int32 and int64, files that disagree), the tile classes a
// window leaves against a brute-force count of visible pairs, and the pair counts of padding. And
// the naive 16-bit emulations of the packed problem (fa/reference_ext.hpp) that set stage 10's
// limits: equal to the dense ones where the problems are the same, and as close to float64 as
// the dense ones are where they are not.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fa/error.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/npy.hpp"
#include "fa/reference.hpp"
#include "fa/reference_backward.hpp"
#include "fa/reference_ext.hpp"
#include "fa/tolerance.hpp"
#include "fa/varlen.hpp"
#include "options.hpp"
#include "support.hpp"

using namespace fa;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

using test::refusal;

// Parses `args` (after the program name) into options, as the executable does.
struct Parsed {
    stage10::Options options;
    CLI::App app{"stage 10 test"};
    explicit Parsed(std::vector<std::string> args) {
        stage10::add_options(app, options);
        std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
        app.parse(args);
    }
};

// An int64 .npy file (numpy's default integer), written byte by byte: version 1, header padded to 64.
void write_int64_npy(const std::string& path, const std::vector<int64_t>& x) {
    std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (" + std::to_string(x.size()) + ",), }";
    dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
    dict.push_back('\n');
    std::string bytes = "\x93NUMPY";
    bytes.push_back(1), bytes.push_back(0);
    bytes.push_back(char(dict.size() & 0xff)), bytes.push_back(char(dict.size() >> 8));
    bytes += dict;
    bytes.append(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(int64_t));
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::vector<float> seeded(size_t n, uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal;
    std::vector<float> x(n);
    for (float& e : x) e = normal(gen);
    return x;
}

}  // namespace

TEST_CASE("--seqlens and --window parse whole numbers and refuse anything else, naming the option") {
    CHECK(stage10::parse_lengths("100,2000,1", "--seqlens") == std::vector<int64_t>{100, 2000, 1});
    CHECK(stage10::parse_lengths("0", "--seqlens") == std::vector<int64_t>{0});
    for (const char* bad : {"", "100,-5", "1,,2", "1,2,", "abc", "1.5", "3000000000", " 7"}) {
        INFO(bad);
        const std::string m = refusal([&] { stage10::parse_lengths(bad, "--seqlens"); });
        CHECK(m.find("--seqlens") != std::string::npos);
    }
    CHECK(refusal([] { stage10::parse_lengths("4,-1", "--seqlens-k"); }).find("'-1' is not a whole number from 0") != std::string::npos);
    const Window w = stage10::parse_window("256,-1");
    CHECK(w.left == 256);
    CHECK(w.right == -1);
    for (const char* bad : {"5", "1,2,3", "a,b", "-2,0", "1,"}) {
        INFO(bad);
        CHECK(refusal([&] { stage10::parse_window(bad); }).find("--window") != std::string::npos);
    }
}

TEST_CASE("the options make the packed problem; what cannot apply is refused with the option named") {
    {
        Parsed p({"--seqlens", "5,0,17", "--seqlens-k", "5,3,20", "--heads", "8", "--kv-heads", "2", "--window", "16,0", "--causal",
                  "--softcap", "30", "--dropout", "0.1", "--dropout-seed", "7", "--dropout-offset", "3"});
        const VarlenProblem vp = stage10::make_problem(p.options, p.app);
        CHECK(vp.cu_seqlens_q == std::vector<int32_t>{0, 5, 5, 22});
        CHECK(vp.cu_seqlens_k == std::vector<int32_t>{0, 5, 8, 28});
        CHECK(vp.heads_q == 8);
        CHECK(vp.heads_k == 2);
        CHECK(vp.window.left == 16);
        CHECK(vp.window.right == 0);  // --causal
        CHECK(vp.softcap == 30.0);
        CHECK(vp.dropout.p == 0.1);
        CHECK(vp.dropout.seed == 7);
        CHECK(vp.dropout.offset == 3);
    }
    {
        Parsed p({});  // the default: a mixed batch with grouped heads
        const VarlenProblem vp = stage10::make_problem(p.options, p.app);
        CHECK(vp.batch() == 5);
        CHECK(vp.heads_q / vp.heads_k == 4);
    }
    const auto refused = [](std::vector<std::string> args) {
        Parsed p(std::move(args));
        return refusal([&] {
            const VarlenProblem vp = stage10::make_problem(p.options, p.app);
            stage10::check_supported(vp, p.options.forward_only, {32, 64, 128, 256}, {32, 64, 128});
        });
    };
    CHECK(refused({"--heads", "8", "--kv-heads", "3"}).find("--heads 8 is not a multiple of --kv-heads 3") != std::string::npos);
    CHECK(refused({"--seqlens", "10,20", "--seqlens-k", "10"}).find("--seqlens-k has 1 entries but --seqlens has 2") != std::string::npos);
    CHECK(refused({"--dropout", "0.1"}).find("needs --dropout-seed") != std::string::npos);
    CHECK(refused({"--dropout-seed", "4"}).find("--dropout-seed without --dropout") != std::string::npos);
    CHECK(refused({"--dropout", "1.5", "--dropout-seed", "4"}).find("--dropout") != std::string::npos);
    CHECK(refused({"--causal", "--window", "10,5"}).find("--window 10,0") != std::string::npos);
    CHECK(refused({"--softcap", "-1"}).find("--softcap") != std::string::npos);
    CHECK(refused({"--head-dim", "96"}).find("--head-dim 96 is not supported by stage 07's forward: use 32, 64, 128 or 256") !=
          std::string::npos);
    CHECK(refused({"--head-dim", "256"}).find("--forward-only") != std::string::npos);
    CHECK(refused({"--head-dim", "256", "--forward-only"}).empty());
    CHECK(refused({"--seqlens", "0,0"}).empty());  // empty sequences are a valid batch
}

TEST_CASE("--load reads packed q, k, v, dO and cu_seqlens, and refuses files of the wrong shape or kind") {
    TempDir dir;
    const int64_t tq = 22, tk = 28, hq = 4, hk = 2, d = 8;
    const std::vector<float> q = seeded(size_t(tq * hq * d), 1), k = seeded(size_t(tk * hk * d), 2), v = seeded(size_t(tk * hk * d), 3);
    write_npy(dir.file("q.npy"), {tq, hq, d}, q);
    write_npy(dir.file("k.npy"), {tk, hk, d}, k);
    write_npy(dir.file("v.npy"), {tk, hk, d}, v);
    const auto load = [&](std::vector<std::string> args) {
        args.insert(args.begin(), {"--load", dir.path.string()});
        Parsed p(std::move(args));
        return stage10::load_packed(p.options, p.app);
    };
    const auto refused = [&](std::vector<std::string> args) { return refusal([&] { load(std::move(args)); }); };

    // Lengths from --seqlens when there are no cu_seqlens files; they must add up to the rows.
    stage10::PackedInputs in = load({"--seqlens", "5,0,17", "--seqlens-k", "5,3,20"});
    CHECK(in.problem.heads_q == hq);
    CHECK(in.problem.heads_k == hk);
    CHECK(in.problem.head_dim == d);
    CHECK(in.in.q.view(0, 3, 7, 5) == q[size_t((7 * hq + 3) * d + 5)]);  // (total, heads, d) read as (1, H, total, d)
    CHECK(in.in.k.view(0, 1, 27, 7) == k[size_t((27 * hk + 1) * d + 7)]);
    CHECK(!in.dout);
    CHECK(refused({"--seqlens", "5,0,16", "--seqlens-k", "5,3,20"}).find("add up to 21 queries but q.npy has 22 rows") != std::string::npos);
    CHECK(refused({"--seqlens", "22", "--heads", "8"}).find("--heads 8 disagrees with the loaded files (4)") != std::string::npos);

    // cu_seqlens in int32 (and int64, as numpy saves by default), then --seqlens is refused.
    write_npy(dir.file("cu_seqlens_q.npy"), {4}, std::vector<int32_t>{0, 5, 5, 22});
    write_npy(dir.file("cu_seqlens_k.npy"), {4}, std::vector<int32_t>{0, 5, 8, 28});
    in = load({});
    CHECK(in.problem.cu_seqlens_k == std::vector<int32_t>{0, 5, 8, 28});
    CHECK(refused({"--seqlens", "22"}).find("leave --seqlens out") != std::string::npos);
    write_int64_npy(dir.file("cu_seqlens_q.npy"), {0, 5, 5, 22});
    CHECK(load({}).problem.cu_seqlens_q == std::vector<int32_t>{0, 5, 5, 22});
    write_int64_npy(dir.file("cu_seqlens_q.npy"), {0, 5, int64_t(1) << 40, 22});
    CHECK(refused({}).find("does not fit in int32") != std::string::npos);
    write_npy(dir.file("cu_seqlens_q.npy"), {2, 2}, std::vector<int32_t>{0, 5, 5, 22});
    CHECK(refused({}).find("expected 1 dimension of B+1 >= 2 entries") != std::string::npos);
    write_npy(dir.file("cu_seqlens_q.npy"), {4}, std::vector<int32_t>{0, 5, 5, 22});
    write_npy(dir.file("cu_seqlens_k.npy"), {3}, std::vector<int32_t>{0, 8, 28});
    CHECK(refused({}).find("cu_seqlens_q.npy has 4 entries but cu_seqlens_k.npy has 3") != std::string::npos);
    write_npy(dir.file("cu_seqlens_k.npy"), {4}, std::vector<float>{0, 5, 8, 28});
    CHECK(refused({}).find("save int32 ('<i4') or int64 ('<i8')") != std::string::npos);
    write_npy(dir.file("cu_seqlens_k.npy"), {4}, std::vector<int32_t>{0, 9, 8, 28});
    CHECK(refused({}).find("cu_seqlens") != std::string::npos);  // decreasing: VarlenProblem::validate()
    write_npy(dir.file("cu_seqlens_k.npy"), {4}, std::vector<int32_t>{0, 5, 8, 28});

    // dO like q; a wrong one is refused.
    write_npy(dir.file("do.npy"), {tq, hq, d}, seeded(size_t(tq * hq * d), 4));
    CHECK(load({}).dout.has_value());
    write_npy(dir.file("do.npy"), {tk, hk, d}, k);
    CHECK(refused({}).find("do.npy has shape (28, 2, 8) but q is (22, 4, 8)") != std::string::npos);
    fs::remove(dir.file("do.npy"));

    // Shapes: 3 dimensions, k and v alike, d agreeing; NaN refused with its place.
    write_npy(dir.file("v.npy"), {1, tk, hk, d}, v);
    CHECK(refused({}).find("expected 3 dimensions (total, heads, d)") != std::string::npos);
    write_npy(dir.file("v.npy"), {tk, hq, d / 2}, std::vector<float>(size_t(tk * hq * d / 2), 1.0f));
    CHECK(refused({}).find("k.npy has shape (28, 2, 8) but v.npy has (28, 4, 4)") != std::string::npos);
    std::vector<float> bad = v;
    bad[9] = std::numeric_limits<float>::quiet_NaN();
    write_npy(dir.file("v.npy"), {tk, hk, d}, bad);
    CHECK(refused({}).find("NaN or inf") != std::string::npos);
}

TEST_CASE("tile classes: a tile is skipped, full or masked exactly as its rows see its keys") {
    // Brute force: per tile, the number of visible (row, key) pairs against the tile's size.
    const auto brute = [](const VarlenProblem& vp, int64_t br, int64_t bc) {
        stage10::TileCounts t;
        for (int64_t b = 0; b < vp.batch(); ++b) {
            const int64_t nq = vp.seq_q(b), nk = vp.seq_k(b);
            for (int64_t r0 = 0; r0 < nq; r0 += br)
                for (int64_t c0 = 0; c0 < nk; c0 += bc) {
                    int64_t seen = 0;
                    const int64_t rows = std::min(br, nq - r0);
                    for (int64_t i = r0; i < r0 + rows; ++i)
                        for (int64_t j = c0; j < std::min(nk, c0 + bc); ++j) {
                            const KeyRange r = visible_key_range(i, nq, nk, vp.window);
                            seen += j >= r.begin && j < r.end;
                        }
                    (seen == 0 ? t.skipped : seen == rows * bc ? t.full : t.masked) += vp.heads_q;
                }
        }
        return t;
    };
    for (const Window w : {Window::full(), Window::causal(), Window{40, 0}, Window{20, 7}, Window{-1, 100}}) {
        VarlenProblem vp;
        vp.cu_seqlens_q = cu_seqlens_from_lengths({300, 0, 1, 130, 64});
        vp.cu_seqlens_k = cu_seqlens_from_lengths({300, 5, 77, 0, 200});
        vp.total_q = vp.cu_seqlens_q.back(), vp.total_k = vp.cu_seqlens_k.back();
        vp.heads_q = 4, vp.heads_k = 2, vp.window = w;
        INFO(vp.describe());
        const stage10::TileCounts got = stage10::count_tiles(vp, 128, 64), want = brute(vp, 128, 64);
        CHECK(got.skipped == want.skipped);
        CHECK(got.masked == want.masked);
        CHECK(got.full == want.full);
        if (w.is_full()) CHECK(got.skipped == 0);
    }
    // Causal on one sequence of 256, tiles of 128 queries by 64 keys: query tile 0 crosses key tiles 0
    // and 1 (masked: row 0 sees key 0 alone) and skips 2 and 3; query tile 1 sees key tiles 0 and 1
    // whole and crosses 2 and 3 (masked).
    VarlenProblem vp;
    vp.cu_seqlens_q = vp.cu_seqlens_k = {0, 256};
    vp.total_q = vp.total_k = 256, vp.heads_q = vp.heads_k = 1, vp.window = Window::causal();
    const stage10::TileCounts t = stage10::count_tiles(vp, 128, 64);
    CHECK(t.full == 2);
    CHECK(t.masked == 4);
    CHECK(t.skipped == 2);
}

TEST_CASE("padding's cost: pairs of the packed call against the batch padded to its longest sequence") {
    VarlenProblem vp;
    vp.cu_seqlens_q = vp.cu_seqlens_k = cu_seqlens_from_lengths({100, 2000, 1});
    vp.total_q = vp.total_k = 2101;
    const stage10::PairCounts c = stage10::count_pairs(vp);
    CHECK(c.packed == 100 * 100 + 2000 * 2000 + 1);
    CHECK(c.padded == 3 * 2000 * 2000);
    CHECK(c.visible == c.packed);
    vp.window = Window::causal();
    CHECK(stage10::count_pairs(vp).visible == 100 * 101 / 2 + 2000 * 2001 / 2 + 1);
}

TEST_CASE("the naive 16-bit emulations of a packed call equal the dense ones where the problems are the same") {
    // B equal sequences, Hq = Hk, causal as (-1, 0): the dense problem exactly. The same products of
    // the same matrices; float32 may still round a sum or an exp differently in the last bit (the
    // compiler's choice), so the comparison allows a few float32 units of the largest value.
    Problem p;
    p.batch = 2, p.heads = 2, p.seq_q = 37, p.seq_k = 53, p.head_dim = 16, p.causal = true;
    const VarlenProblem vp = varlen_from(p);
    const Inputs in = make_varlen_inputs(vp, InputKind::Normal, 11);
    const HostTensor dout = make_varlen_output_gradient(vp, 11);
    // The same numbers as dense (B, H, N, d) tensors: the packed buffers are their BNHD storage.
    const auto dense = [&](const HostTensor& t, int64_t n) {
        return make_view<const float>(t.storage.data(), p.batch, p.heads, n, p.head_dim, Layout::BNHD);
    };
    // Logical (B, H, N, d) -> packed (B N, H, d); the LSE (B, H, N) -> (H, B N).
    const auto packed_of = [&](const std::vector<float>& x, int64_t n, int64_t d) {
        std::vector<float> out(x.size());
        for (int64_t b = 0; b < p.batch; ++b)
            for (int64_t h = 0; h < p.heads; ++h)
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t e = 0; e < d; ++e)
                        out[size_t(d == 1 ? h * p.batch * n + b * n + i : ((b * n + i) * p.heads + h) * d + e)] =
                            x[size_t(((b * p.heads + h) * n + i) * d + e)];
        return out;
    };
    const auto same = [](const std::vector<float>& got, const std::vector<float>& want) {
        const Metrics m = compare(got, want);
        INFO("max_abs " << m.max_abs << " rel_l2 " << m.rel_l2);
        CHECK(m.nonfinite == 0);
        CHECK(m.rel_l2 < 1e-6);
    };
    for (const Precision prec : {Precision::BFloat16, Precision::Float16}) {
        INFO(to_string(prec));
        const EmulatedAttention a = naive_attention_varlen_emulated(prec, vp, in.q.cview(), in.k.cview(), in.v.cview());
        const EmulatedAttention b = naive_attention_emulated(prec, p, dense(in.q, p.seq_q), dense(in.k, p.seq_k), dense(in.v, p.seq_k));
        same(a.o, packed_of(b.o, p.seq_q, p.head_dim));
        same(a.lse, packed_of(b.lse, p.seq_q, 1));
        const EmulatedGradients ga = naive_backward_varlen_emulated(prec, vp, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
        const EmulatedGradients gb = naive_backward_emulated(prec, p, dense(in.q, p.seq_q), dense(in.k, p.seq_k), dense(in.v, p.seq_k),
                                                             dense(dout, p.seq_q));
        same(ga.dq, packed_of(gb.dq, p.seq_q, p.head_dim));
        same(ga.dk, packed_of(gb.dk, p.seq_k, p.head_dim));
        same(ga.dv, packed_of(gb.dv, p.seq_k, p.head_dim));
        for (int g = 0; g < 2; ++g) {
            CHECK(ga.terms_max_abs[g] == doctest::Approx(gb.terms_max_abs[g]).epsilon(1e-5));
            CHECK(ga.terms_l2[g] == doctest::Approx(gb.terms_l2[g]).epsilon(1e-5));
        }
    }
}

TEST_CASE("the naive emulations with every feature on stay as close to float64 as the 16-bit rounding allows") {
    VarlenProblem vp;
    vp.cu_seqlens_q = cu_seqlens_from_lengths({29, 0, 1, 61, 7});
    vp.cu_seqlens_k = cu_seqlens_from_lengths({31, 4, 0, 40, 50});
    vp.total_q = vp.cu_seqlens_q.back(), vp.total_k = vp.cu_seqlens_k.back();
    vp.heads_q = 4, vp.heads_k = 2, vp.head_dim = 16, vp.window = Window{12, 3}, vp.softcap = 5.0;
    vp.dropout = Dropout{0.25, 99, 2};
    const Inputs in = make_varlen_inputs(vp, InputKind::Normal, 5);
    const HostTensor dout = make_varlen_output_gradient(vp, 5);
    const VarlenReference ref = reference_attention_varlen(vp, in.q.cview(), in.k.cview(), in.v.cview());
    const VarlenGradients gref = reference_backward_varlen(vp, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
    for (const Precision prec : {Precision::BFloat16, Precision::Float16}) {
        INFO(to_string(prec));
        const double u = unit_roundoff(prec);
        const EmulatedAttention a = naive_attention_varlen_emulated(prec, vp, in.q.cview(), in.k.cview(), in.v.cview());
        const Metrics mo = compare(a.o, ref.o), ml = compare(a.lse, ref.lse);
        CHECK(mo.nonfinite == 0);
        CHECK(mo.rel_l2 < 8 * u);
        CHECK(mo.rel_l2 > 0.0);  // rounded: never the float64 result itself
        CHECK(ml.max_abs < 8 * u);
        const EmulatedGradients g = naive_backward_varlen_emulated(prec, vp, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
        for (const auto& [got, want] : {std::pair{&g.dq, &gref.dq}, std::pair{&g.dk, &gref.dk}, std::pair{&g.dv, &gref.dv}}) {
            const Metrics m = compare(*got, *want);
            CHECK(m.nonfinite == 0);
            CHECK(m.rel_l2 < 16 * u);
        }
        // The limits they set catch a dropped key: the reference's gradients with one key's dV zeroed fail.
        const GradientTolerances tol = gradient_tolerance(input_stats_varlen(vp, in.q.cview(), in.k.cview(), in.v.cview()), prec,
                                                          Problem{}, g, ReferenceGradients{gref.dq, gref.dk, gref.dv});
        std::vector<float> broken(gref.dv.begin(), gref.dv.end());
        for (int64_t x = 0; x < vp.head_dim; ++x) broken[size_t((70 * vp.heads_k + 1) * vp.head_dim + x)] = 0.0f;
        CHECK(passes(compare(std::vector<float>(gref.dv.begin(), gref.dv.end()), gref.dv), tol.dv));
        CHECK(!passes(compare(broken, gref.dv), tol.dv));
    }
}
