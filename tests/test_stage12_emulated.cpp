// Stage 12's Hopper backward on the CPU, by the warp emulator (tools/warp_emulator: TMA loads that land
// late on mbarriers, wgmma that runs at its wait, with A read transposed for dQ, bulk reductions that read
// shared memory at wait_group.read and add into global memory at wait_group): its three kernels launched
// as the stage launches them (stages/12_hopper_backward/launch.cuh: the tensor maps, the arguments, the
// grids), against the float64 gradients by the course's gradient rule (fa/tolerance.hpp: twice the error
// of the naive backward in the same 16-bit type), as stage 09 is judged; rows that see no key get dQ = 0
// exactly, and every gradient element is written. O and LSE are the float64 forward's of the inputs rounded
// to the 16-bit type, O rounded too (what any correct 16-bit forward gives, to its rounding).
// Every step of the road runs every case; step 2 (a producer warpgroup, two consumers of 64 keys)
// also gives step 1's dK and dV bits, steps 3 and 4 (the dQ writer warp, the shared dQ buffer)
// step 2's, and all run once more with TMA loads that land as soon as they are issued, which shows
// a ring slot released before its readers are done. The deterministic order (steps 3 and 4) runs
// the blocks in their launch order and stops if one ever waits for a turn a later block holds; its
// dQ has the bits of the racing mode with the blocks run last first (the same order of additions),
// and every tile's turn counter ends at the number of additions into it.
// No GPU is needed, so this runs in CI; the GPU test (test_stage12) remains the check of the compiled kernels.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backward_check.hpp"
#include "emulator.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/reference_backward.hpp"
#include "fa/tolerance.hpp"
#include "stages/12_hopper_backward/launch.cuh"
#include "support.hpp"

// The dynamic shared memory the main kernel declares (`extern __shared__ ... smem_raw[]`).
namespace fa::stage12 {
alignas(128) unsigned char smem_raw[232448];
}

namespace {

using namespace fa;
using namespace fa::stage12;
using fa::test::Grads;

/// A 16-bit tensor with the strides of a float32 one (so the same layout), rounded to T, or
/// all bits set (NaN) to be written.
template <class T>
struct Half4 {
    std::vector<uint16_t> bits;
    View4<T> view;
    Half4(View4<const float> x, bool copy) : bits(size_t(span(x)), 0xffff), view{reinterpret_cast<T*>(bits.data()), x.shape, x.stride} {
        if (!copy) return;
        for (int64_t b = 0; b < x.shape[0]; ++b)
            for (int64_t h = 0; h < x.shape[1]; ++h)
                for (int64_t n = 0; n < x.shape[2]; ++n)
                    for (int64_t i = 0; i < x.shape[3]; ++i) bits[size_t(x.offset(b, h, n, i))] = emu::to_bits<T>(x(b, h, n, i));
    }
    static int64_t span(View4<const float> x) {
        int64_t s = 1;
        for (int i = 0; i < 4; ++i) s += (x.shape[i] - 1) * x.stride[i];
        return s;
    }
    /// The elements widened to float32, in logical (b, h, n, x) order.
    std::vector<float> logical() const {
        std::vector<float> out;
        out.reserve(size_t(view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3]));
        for (int64_t b = 0; b < view.shape[0]; ++b)
            for (int64_t h = 0; h < view.shape[1]; ++h)
                for (int64_t n = 0; n < view.shape[2]; ++n)
                    for (int64_t i = 0; i < view.shape[3]; ++i) out.push_back(emu::to_f<T>(bits[size_t(view.offset(b, h, n, i))]));
        return out;
    }
};

/// Step 1 with its ring cut to one slot (each tile loaded only once the previous one is done): the
/// same arithmetic in the same order, so the same bits as step 1's two slots.
struct RingOfOne {
    static constexpr Features value = kStep1.with_ring(1);
};

/// What the backward reads, for case `c` in type T: the inputs and dO, and the forward's O and LSE.
/// The forward is that of the inputs as the kernels see them (rounded to T), in float64, O rounded
/// to T, as a 16-bit forward computes it: its LSE must be that of the rounded scores, or P = exp(S -
/// L) would not sum to 1 where rounding moves large scores (scores of order 400 move by about 1 when
/// q and k are rounded to bf16).
struct BackwardInputs {
    Inputs in;
    HostTensor dout, o;
    std::vector<float> lse;
};

template <class T>
BackwardInputs backward_inputs(const test::Case& c) {
    const Problem& p = c.problem;
    BackwardInputs b{make_inputs(p, c.layout, c.inputs, c.seed), make_output_gradient(p, c.layout, c.seed),
                     HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, c.layout), {}};
    const auto rounded = [](const HostTensor& x) {
        HostTensor r = x;
        for (float& e : r.storage) e = emu::to_f<T>(emu::to_bits<T>(e));
        return r;
    };
    const HostTensor q16 = rounded(b.in.q), k16 = rounded(b.in.k), v16 = rounded(b.in.v);
    const Reference fwd = reference_attention(p, q16.cview(), k16.cview(), v16.cview());
    size_t e = 0;
    for (int64_t bb = 0; bb < p.batch; ++bb)
        for (int64_t h = 0; h < p.heads; ++h)
            for (int64_t n = 0; n < p.seq_q; ++n)
                for (int64_t x = 0; x < p.head_dim; ++x) b.o.view(bb, h, n, x) = float(fwd.o[e++]);
    b.lse.assign(fwd.lse.begin(), fwd.lse.end());
    return b;
}

/// Stage 12's kernels with the features of `Step` (StepN<1>, RingOfOne) at head dimension D on the
/// emulator: the three kernels of launch.cuh in order, on 16-bit copies of the inputs in their
/// layout; the workspace starts as NaN and the gradients as all-ones bits (NaN), so what the
/// kernels forget to write shows.
template <class T, int D, class Step>
Grads run_backward(const Problem& p, const BackwardInputs& bi, bool last_block_first = false,
                   std::vector<float>* workspace_out = nullptr) {
    const Inputs& in = bi.in;
    const HostTensor &o32 = bi.o, &dout32 = bi.dout;
    const std::vector<float>& lse = bi.lse;
    const Half4<T> q(in.q.cview(), true), k(in.k.cview(), true), v(in.v.cview(), true), o(o32.cview(), true),
        dout(dout32.cview(), true);
    Half4<T> dq(in.q.cview(), false), dk(in.k.cview(), false), dv(in.v.cview(), false);
    std::vector<float> workspace(size_t(workspace_floats(p)), std::nanf(""));
    const Launches<T> l = make_launches<T, D, Step>(p, View4<const T>(q.view), View4<const T>(k.view), View4<const T>(v.view),
                                              View4<const T>(o.view), make_view3<const float>(lse.data(), p.batch, p.heads, p.seq_q),
                                              View4<const T>(dout.view), dq.view, dk.view, dv.view, workspace.data());
    const auto launch = [&](auto kernel, const char*, int64_t blocks, int threads, size_t smem, const auto& args) {
        REQUIRE(smem <= sizeof fa::stage12::smem_raw);
        if (blocks > 0) {
            emu::launch(long(blocks), threads, fa::stage12::smem_raw, smem, [&] { decltype(kernel)::value(args); },
                        last_block_first);
        }
    };
    run_kernels<T, D, Step>(l, launch);
    if (workspace_out != nullptr) *workspace_out = workspace;
    return {dq.logical(), dk.logical(), dv.logical()};
}

/// Case `c` in type T at head dimension D: step N on the emulator from backward_inputs(), judged
/// against the float64 gradients by the rule for T.
template <class T, int D, int N = 1, bool Deterministic = false>
void check_case(const test::Case& c) {
    const Problem& p = c.problem;
    REQUIRE(p.head_dim == D);
    const Precision precision = std::is_same_v<T, __half> ? Precision::Float16 : Precision::BFloat16;
    const BackwardInputs bi = backward_inputs<T>(c);
    const Grads got = run_backward<T, D, StepN<N, Deterministic>>(p, bi);
    const test::Judge j = test::judge(p, bi.in, bi.dout, precision);
    const std::string what =
        c.name() + " " + to_string(precision) + " step " + std::to_string(N) + (Deterministic ? " deterministic" : "");
    test::check_gradients(got, j, what + " vs float64 reference");
    test::check_rows_without_keys(p, got, what);
}

/// The cases: N = 1, primes (37, 61, 67, 257) and other sizes no block divides, Nq != Nk both ways, tails no block divides, causal with rows that see
/// no key (Nq > Nk) and key blocks past the diagonal, both layouts, B x H > 1, large logits, a
/// negative and a zero scale; a ring that wraps (more query tiles than slots).
std::vector<test::Case> cases(int64_t d) {
    return test::cases_of({
        {1, 1, 1, 1, false, Layout::BHND, InputKind::Normal, {}},      // N = 1
        {1, 2, 77, 93, false, Layout::BNHD, InputKind::Normal, {}},    // Nq < Nk, tails of 13 and 29
        {1, 1, 93, 77, true, Layout::BHND, InputKind::Normal, {}},     // causal, Nq > Nk: 16 rows see no key
        {2, 1, 200, 70, true, Layout::BNHD, InputKind::Normal, -0.2},  // B = 2, 130 rows see no key, a negative scale
        {1, 1, 61, 190, true, Layout::BHND, InputKind::Normal, {}},    // a prime, causal, Nq < Nk
        {1, 1, 70, 67, false, Layout::BHND, InputKind::Large, {}},     // scores of order 400
        {1, 1, 37, 45, true, Layout::BNHD, InputKind::Normal, 0.0},    // a zero scale: uniform weights
        {1, 1, 1, 300, true, Layout::BHND, InputKind::Normal, {}},     // one query row, five key blocks
        {1, 1, 300, 1, false, Layout::BNHD, InputKind::Normal, {}},    // one key, five query tiles through the ring
        {2, 3, 45, 83, true, Layout::BNHD, InputKind::Normal, 0.3},    // B x H = 6, a custom scale
        {1, 1, 255, 257, true, Layout::BHND, InputKind::Large, {}},    // causal, large logits, the diagonal in every block
    }, d, 1200 + uint64_t(d));
}

}  // namespace

TEST_CASE("emulated stage 12: step 1 matches the float64 gradients in bf16 at d = 64") {
    for (const test::Case& c : cases(64)) check_case<__nv_bfloat16, 64>(c);
}

TEST_CASE("emulated stage 12: step 1 matches the float64 gradients in fp16 at d = 64") {
    for (const test::Case& c : cases(64)) check_case<__half, 64>(c);
}

TEST_CASE("emulated stage 12: step 1 matches the float64 gradients in bf16 at d = 128") {
    for (const test::Case& c : cases(128)) check_case<__nv_bfloat16, 128>(c);
}

TEST_CASE("emulated stage 12: step 1 matches the float64 gradients in fp16 at d = 128") {
    for (const test::Case& c : cases(128)) check_case<__half, 128>(c);
}

TEST_CASE("emulated stage 12: step 2 (warp roles) matches the float64 gradients in bf16 at d = 64") {
    for (const test::Case& c : cases(64)) check_case<__nv_bfloat16, 64, 2>(c);
}

TEST_CASE("emulated stage 12: step 2 (warp roles) matches the float64 gradients in fp16 at d = 64") {
    for (const test::Case& c : cases(64)) check_case<__half, 64, 2>(c);
}

TEST_CASE("emulated stage 12: step 2 (warp roles) matches the float64 gradients in bf16 at d = 128") {
    for (const test::Case& c : cases(128)) check_case<__nv_bfloat16, 128, 2>(c);
}

TEST_CASE("emulated stage 12: step 2 (warp roles) matches the float64 gradients in fp16 at d = 128") {
    for (const test::Case& c : cases(128)) check_case<__half, 128, 2>(c);
}

TEST_CASE("emulated stage 12: steps 3 and 4 (dQ writer, shared dQ) match the float64 gradients in bf16 and fp16 at d = 64") {
    for (const test::Case& c : cases(64)) {
        check_case<__nv_bfloat16, 64, 3>(c);
        check_case<__half, 64, 4>(c);
    }
}

TEST_CASE("emulated stage 12: steps 3 and 4 (dQ writer, shared dQ) match the float64 gradients in bf16 and fp16 at d = 128") {
    for (const test::Case& c : cases(128)) {
        check_case<__half, 128, 3>(c);
        check_case<__nv_bfloat16, 128, 4>(c);
    }
}

TEST_CASE("emulated stage 12: steps 3 and 4 give step 2's dK and dV bits (the writer changes only who adds dQ)") {
    for (const test::Case& c : cases(64)) {
        const BackwardInputs bi = backward_inputs<__nv_bfloat16>(c);
        const Grads two = run_backward<__nv_bfloat16, 64, StepN<2>>(c.problem, bi);
        const Grads three = run_backward<__nv_bfloat16, 64, StepN<3>>(c.problem, bi);
        const Grads four = run_backward<__nv_bfloat16, 64, StepN<4>>(c.problem, bi);
        INFO(c.name());
        for (const Grads* g : {&three, &four}) {
            CHECK(std::memcmp(two.dk.data(), g->dk.data(), two.dk.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(two.dv.data(), g->dv.data(), two.dv.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("emulated stage 12: the deterministic order at steps 3 and 4 matches the float64 gradients, and no block waits "
          "for one launched after it") {
    // emu::launch runs the blocks one at a time in their launch order, and __nanosleep stops the
    // program: a turn not there when its block arrives would be a wait for a later block.
    for (const test::Case& c : cases(64)) {
        check_case<__nv_bfloat16, 64, 3, true>(c);
        check_case<__half, 64, 4, true>(c);
    }
    for (const test::Case& c : cases(128)) {
        check_case<__nv_bfloat16, 128, 3, true>(c);
        check_case<__half, 128, 4, true>(c);
    }
}

/// The deterministic checks of one case at step N: dQ's bits are those of the racing mode run
/// with the blocks in reverse (each head's key blocks then add from the last one down, as the
/// turns order them), dK and dV those of the racing mode, and every query tile's counter ends at
/// the additions into it: (buffers per block) x (key blocks that visit it).
template <int N>
void check_deterministic_order(const test::Case& c) {
    using S = Shape<64, StepN<N>>;
    const Problem& p = c.problem;
    const BackwardInputs bi = backward_inputs<__nv_bfloat16>(c);
    std::vector<float> ws;
    const Grads det = run_backward<__nv_bfloat16, 64, StepN<N, true>>(p, bi, false, &ws);
    const Grads racing_reversed = run_backward<__nv_bfloat16, 64, StepN<N>>(p, bi, true);
    INFO(c.name() << " step " << N);
    CHECK(std::memcmp(det.dq.data(), racing_reversed.dq.data(), det.dq.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(det.dk.data(), racing_reversed.dk.data(), det.dk.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(det.dv.data(), racing_reversed.dv.data(), det.dv.size() * sizeof(float)) == 0);
    const Counts k = counts(p, S::kBlockKeys), t = counts(p);
    const int* turns = reinterpret_cast<const int*>(ws.data() + 2 * t.batch_heads * t.seq_q_padded +
                                                    t.batch_heads * t.seq_q_padded * p.head_dim);
    for (int64_t bh = 0; bh < t.batch_heads; ++bh)
        for (int i = 0; i < int(t.q_tiles); ++i) {
            const int last = last_key_block(i, 64, S::kBlockKeys, int(p.seq_q), int(p.seq_k), int(k.k_blocks), p.causal);
            CHECK(turns[bh * t.q_tiles + i] == S::kDqBuffers * (last + 1));
        }
}

TEST_CASE("emulated stage 12: the deterministic order adds the key blocks from the last one down, every turn once") {
    for (const test::Case& c : cases(64)) {
        check_deterministic_order<3>(c);
        check_deterministic_order<4>(c);
    }
}

TEST_CASE("emulated stage 12: step 2 gives step 1's dK and dV bits (each consumer is step 1's warpgroup on its 64 keys)") {
    // A consumer visits the same query tiles as step 1's block of its keys, in the same order, with
    // the same arithmetic; consumer 1 may visit a tile or two before them that see none of its keys,
    // where P^T = 0 and dS^T = +-0 leave its sums at +0. dQ differs in its last bits: its partials
    // are added in another order.
    for (const test::Case& c : cases(64)) {
        const BackwardInputs bi = backward_inputs<__nv_bfloat16>(c);
        const Grads one = run_backward<__nv_bfloat16, 64, StepN<1>>(c.problem, bi);
        const Grads two = run_backward<__nv_bfloat16, 64, StepN<2>>(c.problem, bi);
        INFO(c.name());
        CHECK(std::memcmp(one.dk.data(), two.dk.data(), one.dk.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(one.dv.data(), two.dv.data(), one.dv.size() * sizeof(float)) == 0);
    }
}

/// While it lives, the emulator's TMA loads land the moment they are issued (emu::hopper::eager_loads).
struct EagerLoads {
    EagerLoads() { emu::hopper::eager_loads = true; }
    ~EagerLoads() { emu::hopper::eager_loads = false; }
    EagerLoads(const EagerLoads&) = delete;
    EagerLoads& operator=(const EagerLoads&) = delete;
};

TEST_CASE("emulated stage 12: every step stays right when every TMA load lands as soon as it is issued") {
    // The other tests land each load as late as possible, which shows a tile read before it has
    // landed. Landing at once shows the opposite bug: a slot refilled while its readers still need
    // it (step 2: an empty barrier arrived on too early; step 1: a load issued before the block-wide
    // barrier), since the next round's bytes then replace Q_i, dO_i, L and D under the consumers.
    // Steps 3 and 4: a dQ buffer freed too early (the writer's empty barrier) shows the same way.
    const EagerLoads eager;
    for (const test::Case& c : cases(64)) {
        check_case<__nv_bfloat16, 64, 1>(c);
        check_case<__nv_bfloat16, 64, 2>(c);
        check_case<__nv_bfloat16, 64, 3>(c);
        check_case<__nv_bfloat16, 64, 4, true>(c);
    }
    for (const test::Case& c : cases(128)) {
        check_case<__half, 128, 2>(c);
        check_case<__half, 128, 4>(c);
    }
}

TEST_CASE("stage 12: the query tiles that visit key block j are first_query_tile(j) .. the last") {
    // A tile visits key block j iff one of its rows sees a key of the block; later rows see more
    // keys, so that is iff its last row sees key j Bc: the tiles from first_query_tile(j) on.
    // Blocks of 64 keys (step 1) and of 128 (step 2's two consumers).
    for (const int bc : {64, 128})
        for (const bool causal : {false, true})
            for (int nq = 1; nq <= 300; nq += 13)
                for (int nk = 1; nk <= 300; nk += 11) {
                    const int tiles = (nq + 63) / 64, blocks = (nk + bc - 1) / bc;
                    for (int j = 0; j < blocks; ++j) {
                        int first = tiles;
                        for (int i = tiles - 1; i >= 0; --i) {
                            const int last_row = std::min(nq, 64 * (i + 1)) - 1;
                            if (visible_key_end(last_row, nq, nk, causal) > int64_t(bc) * j) first = i;
                        }
                        INFO("Nq=" << nq << " Nk=" << nk << (causal ? " causal" : "") << " j=" << j << " Bc=" << bc);
                        REQUIRE(first_query_tile(j, 64, bc, nq, nk, causal) == first);
                    }
                }
}

TEST_CASE("stage 12: a problem beyond the kernels' indices is refused with the limit it breaks") {
    const auto refusal = [](fa::Problem p) {
        try {
            check_hopper_kernel_supports(p);
        } catch (const fa::InputError& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    fa::Problem p;
    p.head_dim = 96;
    CHECK(refusal(p) == "--head-dim 96 is not supported by stage 12: use 64 or 128");
    p.head_dim = 64;
    CHECK(refusal(p) == "(accepted)");
    p.seq_q = (int64_t(1) << 30) + 1;
    CHECK(refusal(p) == "stage 12: --seq-q = 1073741825 is beyond its kernels' indices: at most 2^30 query rows");
    p.seq_q = 1, p.seq_k = (int64_t(1) << 30) + 1;
    CHECK(refusal(p).find("--seq-k = 1073741825") != std::string::npos);
    p.seq_k = 1, p.batch = 1 << 13, p.heads = (1 << 11) + 1;
    CHECK(refusal(p).find("batch x heads = 16785408 is beyond its kernels' indices: at most 2^24") != std::string::npos);
    p.batch = 64, p.heads = 64, p.seq_k = int64_t(64) << 19;  // 4096 heads x 2^19 key blocks = 2^31
    CHECK(refusal(p).find("batch x heads x key blocks of 64 = 2147483648") != std::string::npos);
    p.seq_k = 1, p.seq_q = 1000000;  // 2 x 4096 x 1000000 rows of statistics: 8.2e9 >= 2^32
    CHECK(refusal(p).find("the statistics' tensor map") != std::string::npos);
    p.seq_q = 500000;  // 2 x 4096 x 500032 = 4.1e9 < 2^32
    CHECK(refusal(p) == "(accepted)");
}

TEST_CASE("emulated stage 12: a ring of one slot gives step 1's bits (the ring changes when tiles load, not what is computed)") {
    for (const test::Case& c : cases(64)) {
        const BackwardInputs bi = backward_inputs<__nv_bfloat16>(c);
        const Grads two = run_backward<__nv_bfloat16, 64, StepN<1>>(c.problem, bi);
        const Grads one = run_backward<__nv_bfloat16, 64, RingOfOne>(c.problem, bi);
        INFO(c.name());
        CHECK(std::memcmp(two.dq.data(), one.dq.data(), two.dq.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(two.dk.data(), one.dk.data(), two.dk.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(two.dv.data(), one.dv.data(), two.dv.size() * sizeof(float)) == 0);
    }
}
