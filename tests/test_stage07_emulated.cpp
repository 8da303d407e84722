// Stage 07's forward kernel with stage 10's switches (grouped-query heads, sliding windows, the soft
// cap), launched as the stage launches it (stages/07_pipelined_fused_kernel/launch.cuh: the options
// resolved, the instance chosen, the arguments built) and run on the CPU by the warp emulator
// (tools/warp_emulator), against the float64 reference of fa/reference_ext.hpp by the low-precision
// rule (fa/tolerance.hpp: twice the error of the same attention computed naively in bf16 or fp16).
// No GPU is needed, so this runs in CI; the GPU tests remain the check of the compiled kernels.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "emulator.hpp"
#include "fa/error.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/reference_ext.hpp"
#include "fa/tolerance.hpp"
#include "fa/varlen.hpp"
#include "model_cases.hpp"
#include "stages/07_pipelined_fused_kernel/launch.cuh"

namespace fa::stage07 {
// The dynamic shared memory the kernel declares (`extern __shared__ ... smem_raw[]`).
alignas(128) unsigned char smem_raw[232448];
}  // namespace fa::stage07

namespace {

using namespace fa;
using namespace fa::stage07;

template <class T>
uint16_t to_bits(float f);
template <>
uint16_t to_bits<__nv_bfloat16>(float f) { return emu_f2bf(f); }
template <>
uint16_t to_bits<__half>(float f) { return emu_f2h(f); }

// Runs the case through the stage's launch code (launch.cuh: the options resolved, the instance
// chosen, the arguments built) on the emulator, in T at head dimension D; returns whether the
// kernel with stage 10's switches ran (otherwise the road's final kernel did).
template <class T, int D>
bool run_emulated(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o, std::vector<float>& lse) {
    const Problem p = c.problem();
    const int64_t total_q = int64_t(c.B) * c.Nq;
    const auto bits = [](const std::vector<float>& x) {
        std::vector<uint16_t> r(x.size());
        for (size_t i = 0; i < r.size(); ++i) r[i] = to_bits<T>(x[i]);
        return r;
    };
    const std::vector<uint16_t> q = bits(in.q), k = bits(in.k), v = bits(in.v);
    std::vector<uint16_t> o16(o.size(), 0xffff);  // NaN: what the kernel forgets to write shows
    // (B, H, N, d) views of the packed (total, H, d) buffers; the LSE (B, Hq, Nq) of an (Hq, total_q) buffer.
    const auto view = [&](const std::vector<uint16_t>& x, int64_t h, int64_t n) {
        return View4<const T>{reinterpret_cast<const T*>(x.data()), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const View4<T> ov{reinterpret_cast<T*>(o16.data()), {c.B, c.Hq, c.Nq, D}, {int64_t(c.Nq) * c.Hq * D, D, int64_t(c.Hq) * D, 1}};
    const View3<float> lv{lse.data(), {c.B, c.Hq, c.Nq}, {c.Nq, total_q, 1}};
    const ResolvedOptions m = resolve_options(p, c.options());
    const bool model = with_final_features<D>(m, [&](auto features) {
        using F = decltype(features);
        using S = Shape<T, D, F>;
        const Args<T> a = make_args<T>(p, m, view(q, c.Hq, c.Nq), view(k, c.Hk, c.Nk), view(v, c.Hk, c.Nk), ov, lv,
                                       geometry<T, D, F>());
        REQUIRE(S::kSmemBytes <= sizeof smem_raw);
        emu::launch(long(grid_blocks(a)), S::kThreads, smem_raw, S::kSmemBytes, [&] { flash_forward_kernel<T, D, F>(a); });
        return F::kWindow;
    });
    for (size_t i = 0; i < o.size(); ++i) o[i] = emu::to_f<T>(o16[i]);
    return model;
}

template <class T>
bool run_emulated_for(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o, std::vector<float>& lse) {
    switch (c.d) {
        case 32: return run_emulated<T, 32>(c, in, o, lse);
        case 64: return run_emulated<T, 64>(c, in, o, lse);
        case 128: return run_emulated<T, 128>(c, in, o, lse);
        default: return run_emulated<T, 256>(c, in, o, lse);
    }
}

std::optional<bool> run_case(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o,
                             std::vector<float>& lse) {
    return c.precision == Precision::BFloat16 ? run_emulated_for<__nv_bfloat16>(c, in, o, lse)
                                              : run_emulated_for<__half>(c, in, o, lse);
}

}  // namespace

TEST_CASE("emulated stage 07: the window's key tiles cover every visible key and mask every partial tile") {
    // Every (row, key) a row sees lies in a visited tile; every tile called unmasked is seen in
    // full by every row of the query tile; with (-1, 0) the tiles are key_tiles()'s causal ones.
    std::mt19937 rng(11);
    const int shapes[][2] = {{128, 64}, {64, 32}, {64, 64}};
    for (int trial = 0; trial < 3000; ++trial) {
        const int br = shapes[trial % 3][0], bc = shapes[trial % 3][1];
        const int nq = 1 + int(rng() % 300), nk = 1 + int(rng() % 300);
        const Window w{int(rng() % 5) == 0 ? -1 : int(rng() % 200), int(rng() % 5) == 0 ? -1 : int(rng() % 200)};
        for (int q0 = 0; q0 < nq; q0 += br) {
            int first, full_first, full_end, end;
            window_key_tiles(q0, br, bc, nq, nk, w, first, full_first, full_end, end);
            INFO("Nq=" << nq << " Nk=" << nk << " window=(" << w.left << "," << w.right << ") Br=" << br << " Bc=" << bc
                       << " q0=" << q0 << ": tiles [" << first << ", " << end << "), unmasked [" << full_first << ", "
                       << full_end << ")");
            REQUIRE(0 <= first);
            REQUIRE(first <= full_first);
            REQUIRE(full_first <= full_end);
            REQUIRE(full_end <= end);
            bool ok = true;
            for (int i = q0; i < std::min(q0 + br, nq); ++i) {
                const KeyRange r = visible_key_range(i, nq, nk, w);
                if (!r.empty()) ok = ok && r.begin >= int64_t(first) * bc && r.end <= int64_t(end) * bc;
                ok = ok && (full_first == full_end || (r.begin <= int64_t(full_first) * bc && int64_t(full_end) * bc <= r.end));
            }
            REQUIRE(ok);
            if (w.left < 0 && w.right == 0) {
                int full, causal_end;
                key_tiles(q0, br, bc, nq, nk, true, true, full, causal_end);
                CHECK(first == 0);
                CHECK(full_first == 0);
                CHECK(full_end == full);
                CHECK(end == causal_end);
            }
        }
    }
}

TEST_CASE("emulated stage 07: grouped-query heads, sliding windows and the soft cap match the float64 reference") {
    // tests/model_cases.hpp: Hq/Hk = 1, 2, 4, windows narrower than a tile and wider than N, both
    // bounds, causal as (-1, 0), rows that see no key, tails, Nq != Nk, bf16 and fp16, d 32 to 256.
    for (const test::ModelCase& c : test::model_cases()) test::check_model_case(c, run_case);
}

TEST_CASE("emulated stage 07: options that cannot apply are refused with InputError") {
    Problem p;
    p.heads = 6, p.seq_q = 10, p.seq_k = 10;
    const auto message = [&](const ModelOptions& o) -> std::string {
        try {
            resolve_options(p, o);
        } catch (const InputError& e) {
            return e.what();
        }
        return "(no error)";
    };
    ModelOptions o;
    o.kv_heads = 4;
    const std::string m = message(o);
    INFO(m);
    CHECK(m.find("--heads 6") != std::string::npos);
    CHECK(m.find("--kv-heads 4") != std::string::npos);
    o.kv_heads = 3;
    CHECK(message(o) == "(no error)");
    CHECK(resolve_options(p, o).kv_group == 2);
    o.window = Window{-2, 0};
    CHECK(message(o).find("--window -2,0") != std::string::npos);
    o.window = Window::full(), o.softcap = -1.0;
    CHECK(message(o).find("--softcap") != std::string::npos);
    o.softcap = std::numeric_limits<double>::infinity();
    CHECK(message(o).find("--softcap") != std::string::npos);
}
