// Stage 04 (CPU tiling) against stage 03 and the float64 reference, over many block sizes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "../stages/01_naive_attention/attention.hpp"
#include "../stages/03_online_softmax/attention.hpp"
#include "../stages/04_cpu_tiling/attention.hpp"
#include "fa/error.hpp"
#include "support.hpp"

using namespace fa;

namespace {

const std::vector<int64_t> kHeadDims{1, 2, 7, 16, 64, 128, 200};

// Stage 04 with a given tiling, as an AttentionFn.
AttentionFn tiled(stage04::Tiling t) {
    return [t](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
               View3<float> lse) { stage04::attention_tiled(p, q, k, v, o, lse, t); };
}

stage04::Tiling tiling(int64_t Br, int64_t Bc, bool local = false) {
    stage04::Tiling t;
    t.Br = Br;
    t.Bc = Bc;
    t.local_softmax = local;
    return t;
}

// A dense (B, H, N, d) buffer stored as (B, H, d, N): the feature axis has stride N, not 1.
struct FeatureMajor {
    std::vector<float> storage;
    View4<float> view;
    FeatureMajor(int64_t B, int64_t H, int64_t N, int64_t d)
        : storage(size_t(B * H * N * d), std::nanf("")), view{storage.data(), {B, H, N, d}, {H * d * N, d * N, 1, N}} {}
};

}  // namespace

TEST_CASE("stage 04 with its default blocks matches the float64 reference on every standard case") {
    for (const test::Case& c : test::standard_cases(kHeadDims)) test::check_against_reference(stage04::attention, c);
}

TEST_CASE("stage 04 matches stage 03 on every standard case, with blocks small enough to cut every row") {
    for (const test::Case& c : test::standard_cases(kHeadDims)) {
        const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
        const test::Result want = test::run(stage03::attention, c.problem, in, c.layout);
        const Tolerances tol = test::tolerances_for(c.problem, in);
        test::check_close(test::run(stage04::attention, c.problem, in, c.layout), want.o, want.lse, tol,
                          c.name() + " default blocks vs stage 03");
        test::check_close(test::run(tiled(tiling(16, 32)), c.problem, in, c.layout), want.o, want.lse, tol,
                          c.name() + " Br=16 Bc=32 vs stage 03");
    }
}

TEST_CASE("stage 04 is right for any Br and Bc: unequal, 1 x 1, larger than N, dividing nothing") {
    const stage04::Tiling tilings[] = {tiling(1, 1),   tiling(1, 13),   tiling(13, 1),  tiling(3, 5),
                                       tiling(5, 3),   tiling(16, 16),  tiling(17, 29), tiling(32, 64),
                                       tiling(64, 32), tiling(128, 512), tiling(1000, 1000), tiling(4096, 2)};
    const int64_t sizes[][2] = {{1, 1}, {1, 37}, {37, 1}, {61, 67}, {97, 131}, {130, 70}};
    uint64_t seed = 500;
    for (int64_t d : {1, 7, 64}) {
        for (const auto& s : sizes) {
            for (bool causal : {false, true}) {
                test::Case c;
                c.problem = test::make_problem(1, 2, s[0], s[1], d, causal);
                c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
                const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
                const Tolerances tol = test::tolerances_for(c.problem, in);
                for (const stage04::Tiling& t : tilings) {
                    const test::Result got = test::run(tiled(t), c.problem, in, c.layout);
                    test::check_close(got, ref.o, ref.lse, tol,
                                      c.name() + " Br=" + std::to_string(t.Br) + " Bc=" + std::to_string(t.Bc));
                }
            }
        }
    }
}

TEST_CASE("stage 04 stays finite and right on large inputs across many key blocks") {
    for (bool causal : {false, true}) {
        test::Case c;
        c.problem = test::make_problem(1, 2, 150, 170, 64, causal);
        c.inputs = InputKind::Large;
        c.seed = 21;
        const test::Result got = test::check_against_reference(tiled(tiling(32, 24)), c);
        for (float x : got.o) CHECK(std::isfinite(x));
    }
}

TEST_CASE("block-local softmax is WRONG: normalizing each S_ij on its own is not the softmax of the row") {
    const Problem p = test::make_problem(1, 2, 256, 256, 64, false);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 9);
    const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
    const Tolerances tol = test::tolerances_for(p, in);

    SUBCASE("with 4 key blocks per row the error is of the order of the output itself") {
        const test::Result local = test::run(tiled(tiling(64, 64, true)), p, in, Layout::BHND);
        const Metrics mo = compare(local.o, ref.o);
        const Metrics ml = compare(local.lse, ref.lse);
        INFO("O rel_l2 = " << mo.rel_l2 << ", LSE max_abs = " << ml.max_abs);
        CHECK(mo.nonfinite == 0);
        CHECK(mo.rel_l2 > 0.5);   // not rounding: the limit is about 3e-5
        CHECK(ml.max_abs > 0.1);  // only the last block's statistics survive
        CHECK_FALSE(passes(mo, tol.o));
        // The online softmax with the very same blocks is right.
        test::check_close(test::run(tiled(tiling(64, 64)), p, in, Layout::BHND), ref.o, ref.lse, tol,
                          "online softmax, Br=Bc=64");
    }
    SUBCASE("with a single key block (Bc >= Nk) the block's softmax is the row's softmax") {
        const test::Result local = test::run(tiled(tiling(64, 256, true)), p, in, Layout::BHND);
        test::check_close(local, ref.o, ref.lse, tol, "block-local softmax, one key block");
    }
}

TEST_CASE("stage 04 skips the key blocks above the causal diagonal and masks only those crossing it") {
    const Problem p = test::make_problem(1, 1, 512, 512, 8, true);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 2);
    HostTensor o(1, 1, 512, 8, Layout::BHND);
    std::vector<float> lse(512);
    const auto run = [&](const Problem& prob, stage04::Tiling t) {
        return stage04::attention_tiled(prob, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                                        make_view3(lse.data(), 1, 1, 512), t);
    };
    // Br = Bc = 64: Tr = Tc = 8; block row i computes key blocks 0..i, of which block i is masked.
    stage04::BlockCounts c = run(p, tiling(64, 64));
    CHECK(c.total == 64);
    CHECK(c.computed == 36);
    CHECK(c.masked == 8);
    CHECK(c.skipped == 28);
    // Br = 64, Bc = 128: query block i sees keys [0, 64 (i + 1)), i.e. ceil((i + 1) / 2) key blocks.
    c = run(p, tiling(64, 128));
    CHECK(c.total == 32);
    CHECK(c.computed == 20);
    CHECK(c.masked == 8);
    CHECK(c.skipped == 12);
    // Without the mask every block is computed and none is masked.
    Problem full = p;
    full.causal = false;
    c = run(full, tiling(64, 64));
    CHECK(c.computed == c.total);
    CHECK(c.masked == 0);
    CHECK(c.skipped == 0);
}

TEST_CASE("stage 04 gives O = 0 and LSE = -inf to rows that see no key, even inside a block whose other rows do") {
    const Problem p = test::make_problem(1, 1, 300, 100, 16, true);  // rows 0..199 see nothing
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 8);
    const test::Result got = test::run(tiled(tiling(64, 32)), p, in, Layout::BHND);  // block 3 = rows 192..255
    for (int64_t i = 0; i < 300; ++i) {
        const float l = got.lse[size_t(i)];
        CHECK((std::isinf(l) && l < 0) == (i < 200));
        for (int64_t x = 0; x < 16; ++x) {
            const float y = got.o[size_t(i * 16 + x)];
            CHECK(std::isfinite(y));
            if (i < 200) CHECK(y == 0.0f);
        }
    }
    const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
    test::check_close(got, ref.o, ref.lse, test::tolerances_for(p, in), "300 x 100 causal, Br=64 Bc=32");
}

TEST_CASE("stage 04 gives the same logical result in both layouts, and reads any strides") {
    const Problem p = test::make_problem(2, 3, 70, 90, 24, true);
    const stage04::Tiling t = tiling(16, 32);
    const test::Result bhnd = test::run(tiled(t), p, make_inputs(p, Layout::BHND, InputKind::Normal, 5), Layout::BHND);
    const test::Result bnhd = test::run(tiled(t), p, make_inputs(p, Layout::BNHD, InputKind::Normal, 5), Layout::BNHD);
    CHECK(bhnd.o == bnhd.o);  // the layout moves bytes, not arithmetic: bit for bit
    CHECK(bhnd.lse == bnhd.lse);

    // The feature axis with stride N (a "transposed" head): stage 04 gathers it once per head.
    const Inputs dense = make_inputs(p, Layout::BHND, InputKind::Normal, 5);
    FeatureMajor q(2, 3, 70, 24), k(2, 3, 90, 24), v(2, 3, 90, 24), o(2, 3, 70, 24);
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < 3; ++h)
            for (int64_t x = 0; x < 24; ++x) {
                for (int64_t n = 0; n < 70; ++n) q.view(b, h, n, x) = dense.q.view(b, h, n, x);
                for (int64_t n = 0; n < 90; ++n) {
                    k.view(b, h, n, x) = dense.k.view(b, h, n, x);
                    v.view(b, h, n, x) = dense.v.view(b, h, n, x);
                }
            }
    std::vector<float> lse(size_t(p.lse_elems()), std::nanf(""));
    stage04::attention_tiled(p, q.view, k.view, v.view, o.view, make_view3(lse.data(), 2, 3, 70), t);
    CHECK(to_logical(View4<const float>(o.view)) == bhnd.o);
    CHECK(lse == bhnd.lse);
}

TEST_CASE("stage 04 refuses block sizes out of range, naming the option") {
    const Problem p = test::make_problem(1, 1, 8, 8, 4, false);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 1);
    HostTensor o(1, 1, 8, 4, Layout::BHND);
    std::vector<float> lse(8);
    for (const stage04::Tiling& bad : {tiling(0, 64), tiling(64, 0), tiling(-3, 8), tiling(stage04::kMaxBlock + 1, 8)}) {
        CHECK_THROWS_AS(stage04::check_tiling(bad), InputError);
        CHECK_THROWS_AS(stage04::attention_tiled(p, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                                                 make_view3(lse.data(), 1, 1, 8), bad),
                        InputError);
    }
    CHECK_THROWS_WITH(stage04::check_tiling(tiling(0, 64)), doctest::Contains("--block-m"));
    CHECK_THROWS_WITH(stage04::check_tiling(tiling(64, 0)), doctest::Contains("--block-n"));
    CHECK_NOTHROW(stage04::check_tiling(tiling(1, stage04::kMaxBlock)));
}

TEST_CASE("stage 04's memory at N = 16384 is under 5% of stage 01's, and independent of N") {
    const Problem big = test::make_problem(1, 1, 16384, 16384, 64, false);
    const Problem bigger = test::make_problem(1, 1, 65536, 65536, 64, false);
    const stage04::Tiling t;
    CHECK(stage04::intermediate_bytes(big, t) < 0.05 * stage01::intermediate_bytes(big));
    CHECK(stage04::intermediate_bytes(big, t) == stage04::intermediate_bytes(bigger, t));
}
