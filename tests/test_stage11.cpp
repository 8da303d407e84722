// Stage 11 (the Hopper kernel, bf16 and fp16) against the float64 reference and stage 07 by the
// low-precision rule; every step of the road; the awkward sizes; rows that see no key; any scale.
// Exits 77 (skipped) without a Hopper GPU.
#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "../stages/11_hopper_kernel/attention.cuh"
#include "../stages/11_hopper_kernel/timeline.hpp"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/tolerance.hpp"
#include "support.hpp"

using namespace fa;
using fa::cuda::DType;

namespace {

Precision precision_of(DType dtype) { return dtype == DType::BF16 ? Precision::BFloat16 : Precision::Float16; }

// The low-precision rule (fa::low_precision_tolerance): twice the error of naive attention in
// the same 16-bit type, plus a floor.
Tolerances low_precision_limits(const Problem& p, const Inputs& in, const Reference& ref, DType dtype) {
    const Precision precision = precision_of(dtype);
    const EmulatedAttention naive = naive_attention_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview());
    return low_precision_tolerance(input_stats(p, in.q.cview(), in.k.cview(), in.v.cview()), precision,
                                   compare(naive.o, ref.o), compare(naive.lse, ref.lse));
}

// The steps under test: every step of the road after stage 07's (1 .. last), or the
// comma-separated list in FA_STAGE11_STEPS (so that a step that hangs on a new GPU can be left out
// while the others are checked).
std::vector<int> steps_under_test() {
    std::vector<int> steps;
    const char* env = std::getenv("FA_STAGE11_STEPS");
    if (env != nullptr && *env != '\0') {
        std::stringstream list(env);
        std::string item;
        while (std::getline(list, item, ',')) {
            if (!item.empty()) steps.push_back(std::stoi(item));
        }
    } else {
        for (int step = 1; step < int(stage11::road().size()); ++step) steps.push_back(step);
    }
    return steps;
}

bool under_test(int step) {
    for (int s : steps_under_test()) {
        if (s == step) return true;
    }
    MESSAGE("step " << step << " left out by FA_STAGE11_STEPS");
    return false;
}

void check_case(const test::Case& c, DType dtype, int step) {
    const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
    const test::Result got = test::run(stage11::host_entry(dtype, step), c.problem, in, c.layout);
    const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
    test::check_close(got, ref.o, ref.lse, low_precision_limits(c.problem, in, ref, dtype),
                      c.name() + " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step) + " vs float64");
}

}  // namespace

// One test case per step, so that a failure says which step of the road broke.
TEST_CASE("stage 11 step 1 (wgmma, cp.async) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(1)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 1);
        check_case(c, DType::FP16, 1);
    }
}

TEST_CASE("stage 11 step 2 (TMA ring on mbarriers) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(2)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 2);
        check_case(c, DType::FP16, 2);
    }
}

TEST_CASE("stage 11 step 3 (producer warpgroup, setmaxnreg) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(3)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 3);
        check_case(c, DType::FP16, 3);
    }
}

TEST_CASE("stage 11 step 4 (ping-pong, named barriers) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(4)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 4);
        check_case(c, DType::FP16, 4);
    }
}

TEST_CASE("stage 11 step 5 (softmax overlap inside a warpgroup) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(5)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 5);
        check_case(c, DType::FP16, 5);
    }
}

TEST_CASE("stage 11 step 6 (heaviest tiles first across groups of heads) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(6)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 6);
        check_case(c, DType::FP16, 6);
    }
}

TEST_CASE("stage 11 step 7 (TMA-store epilogue) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(7)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 7);
        check_case(c, DType::FP16, 7);
    }
}

TEST_CASE("stage 11 step 8 (three consumer warpgroups at d = 64) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(8)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 8);
        check_case(c, DType::FP16, 8);
    }
}

TEST_CASE("stage 11 step 9 (persistent grid) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(9)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 9);
        check_case(c, DType::FP16, 9);
    }
}

TEST_CASE("stage 11 step 10 (the epilogue's 16-byte stores) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(10)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 10);
        check_case(c, DType::FP16, 10);
    }
}

TEST_CASE("stage 11 step 11 (small blocks for short causal heads at d = 64) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(11)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 11);
        check_case(c, DType::FP16, 11);
    }
}

TEST_CASE("stage 11 step 12 (the next work item claimed early) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(12)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 12);
        check_case(c, DType::FP16, 12);
    }
}

TEST_CASE("stage 11 step 13 (O staged and stored by the TMA) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(13)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 13);
        check_case(c, DType::FP16, 13);
    }
}

TEST_CASE("stage 11 step 14 (batched epilogue) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(14)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 14);
        check_case(c, DType::FP16, 14);
    }
}

TEST_CASE("stage 11 step 15 (K and V on rings of their own, d = 128's O staged) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(15)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 15);
        check_case(c, DType::FP16, 15);
    }
}

TEST_CASE("stage 11 step 16 (warpgroups whose rows lie past Nq compute nothing) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(16)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 16);
        check_case(c, DType::FP16, 16);
    }
}

TEST_CASE("stage 11 step 17 (O rescaled only when a row's maximum grows past 2^8) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(17)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 17);
        check_case(c, DType::FP16, 17);
    }
}

TEST_CASE("stage 11's road: every step has a test case above, and the default step is on the road") {
    // A new step needs its own test case (a failure then names the step): update this count with it.
    CHECK(stage11::road().size() == 18);
    CHECK(stage11::final_step() >= 1);
    CHECK(stage11::final_step() < int(stage11::road().size()));
}

TEST_CASE("stage 11 handles the diagonal wherever it falls against its 64/128/192-row and 128-key tiles") {
    const std::vector<std::array<int64_t, 2>> sizes = {{128, 128}, {129, 128}, {128, 129}, {191, 257}, {257, 191}, {300, 64},
                                                       {64, 300},  {1, 500},   {500, 1},   {2, 3},     {383, 389}};
    for (int step : steps_under_test()) {
        for (const test::Case& c : test::diagonal_cases(sizes, {64, 128}, 1100)) {
            check_case(c, c.seed % 3 == 2 ? DType::FP16 : DType::BF16, step);  // every third case in fp16
        }
    }
}

TEST_CASE("stage 11 writes every output; rows and whole query tiles that see no key get O = 0, LSE = -inf") {
    for (int step : steps_under_test()) {
        for (int64_t d : {64, 128}) {
            for (DType dtype : {DType::BF16, DType::FP16}) {
                const Problem p = test::make_problem(2, 1, 300, 100, d, true);
                const Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, 13);
                INFO("step " << step << " d " << d << " " << cuda::to_string(dtype));
                const test::Result got = test::run(stage11::host_entry(dtype, step), p, in, Layout::BNHD);
                test::check_rows_without_keys(p, got);
            }
        }
    }
}

TEST_CASE("stage 11 takes any finite scale: negative, zero, large") {
    for (int step : steps_under_test()) {
        for (const test::Case& c : test::scale_cases(1200)) check_case(c, DType::BF16, step);
    }
}

TEST_CASE("stage 11 agrees with stage 07 by the same rule, every step") {
    for (int step : steps_under_test()) {
        for (const test::Case& c : test::standard_cases({64, 128})) {
            if (c.problem.seq_q * c.problem.seq_k > 20000) continue;
            for (DType dtype : {DType::BF16, DType::FP16}) {
                const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
                const test::Result got = test::run(stage11::host_entry(dtype, step), c.problem, in, c.layout);
                const test::Result want = test::run(stage07::host_entry(dtype), c.problem, in, c.layout);
                const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
                test::check_close(got, want.o, want.lse, low_precision_limits(c.problem, in, ref, dtype),
                                  c.name() + " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step) +
                                      " vs stage 07");
            }
        }
    }
}

TEST_CASE("stage 11 on longer sequences and several heads, both layouts") {
    uint64_t seed = 1300;
    for (int step : steps_under_test()) {
        for (bool causal : {false, true}) {
            test::Case c;
            c.problem = test::make_problem(2, 3, 1000, 1000, step % 2 && step != 11 ? 128 : 64, causal);
            c.layout = step % 2 ? Layout::BNHD : Layout::BHND;
            c.seed = seed++;
            check_case(c, DType::BF16, step);
        }
    }
}

TEST_CASE("stage 11's causal block order in several groups of heads (a 1 MiB budget) and in one group (the default)") {
    // K and V of a head: 2 x 1024 x d x 2 bytes, 256 KiB at d = 64 and 512 KiB at d = 128: with a
    // 1 MiB budget, groups of 4 and of 2 heads over 6 (batch, head) pairs, the last group short
    // at d = 64. Every step from 6 on orders its blocks so; steps before it ignore the budget.
    uint64_t seed = 1400;
    for (const char* mib : {"1", ""}) {
        setenv("FA_STAGE11_GROUP_MIB", mib, 1);
        for (int step : steps_under_test()) {
            for (int64_t d : {64, 128}) {
                test::Case c;
                c.problem = test::make_problem(2, 3, 1000, 1024, d, true);
                c.layout = d == 64 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                INFO("FA_STAGE11_GROUP_MIB=" << mib);
                INFO(stage11::describe_config(c.problem, step));
                check_case(c, step % 2 ? DType::FP16 : DType::BF16, step);
            }
        }
    }
    setenv("FA_STAGE11_GROUP_MIB", "0", 1);
    CHECK_THROWS_WITH_AS(stage11::describe_config(test::make_problem(1, 2, 64, 64, 64, true), 6),
                         doctest::Contains("FA_STAGE11_GROUP_MIB=0"), InputError);
    unsetenv("FA_STAGE11_GROUP_MIB");
    CHECK(stage11::describe_config(test::make_problem(2, 3, 1000, 1024, 128, true), 6).find("groups of 6 heads") != std::string::npos);
}

namespace {

/// The marks of warpgroup `g` (up to the first empty record).
std::vector<cuda::TimelineMark> marks_of(const std::vector<cuda::TimelineMark>& all, int g) {
    std::vector<cuda::TimelineMark> out;
    for (int n = 0; n < stage11::kTimelineMarks; ++n) {
        const cuda::TimelineMark& m = all[size_t(g) * stage11::kTimelineMarks + size_t(n)];
        if (m.cycle == 0) break;
        out.push_back(m);
    }
    return out;
}

/// The codes of `marks`, in order, with the tile of each: "start q_issued load_issued:0 ...".
std::string codes_text(const std::vector<cuda::TimelineMark>& marks) {
    std::string text;
    for (const auto& m : marks) {
        const int code = m.what;
        text += std::string(text.empty() ? "" : " ") + stage11::timeline_code_name(code);
        if (code != stage11::kMarkStart && code != stage11::kMarkEnd && code != stage11::kMarkQIssued &&
            code != stage11::kMarkQLanded && code != stage11::kMarkEpilogue && code != stage11::kMarkQEmpty) {
            text += ':';
            text += std::to_string(m.tile);  // not ":" + ...: GCC 12's -Wrestrict misreads that form
        }
    }
    return text;
}

/// The key tiles of each work item a persistent block took, from its `item` marks.
std::vector<int> items_of(const std::vector<cuda::TimelineMark>& marks) {
    std::vector<int> items;
    for (const auto& m : marks) {
        if (m.what == stage11::kMarkItem) items.push_back(m.tile);
    }
    return items;
}

/// For each work item in `marks` (a consumer warpgroup's), whether the warpgroup only passed its
/// turns (step 16 on: its rows all lie past Nq), which leaves no mark between q_landed and the
/// epilogue.
std::vector<bool> passed_items(const std::vector<cuda::TimelineMark>& marks) {
    std::vector<bool> passed;
    for (size_t n = 0; n < marks.size(); ++n) {
        if (marks[n].what != stage11::kMarkItem) continue;
        const bool landed = n + 1 < marks.size() && marks[n + 1].what == stage11::kMarkQLanded;
        passed.push_back(landed && n + 2 < marks.size() && marks[n + 2].what == stage11::kMarkEpilogue);
    }
    return passed;
}

/// What the marks of one warpgroup of block `t` must read (timeline.hpp) for its work items
/// `items` (the key tiles of each, in order: {t.end}, or a persistent block's items_of()), where
/// `passed[i]` says whether the warpgroup only passed its turns in item i (empty: in none).
std::string expected_codes(int warpgroup, const stage11::TimelineBlock& t, const std::vector<int>& items,
                           const std::vector<bool>& passed = {}) {
    const auto at = [](const char* code, int tile) { return std::string(" ") + code + ":" + std::to_string(tile); };
    std::string text = "start";
    int ring = 0, rounds = 0;  // K/V tiles and Q tiles the block has loaded
    for (size_t i = 0; i < items.size(); ++i) {
        const int tiles = items[i];
        if (t.persistent) text += at("item", tiles);
        if (warpgroup > 0 && i < passed.size() && passed[i] && tiles > 0) {
            text += " q_landed epilogue";
            continue;
        }
        if (warpgroup == 0) {  // the producer
            if (tiles == 0) continue;
            text += std::string(rounds++ > 0 ? " q_empty" : "") + " q_issued";
            for (int j = 0; j < tiles; ++j, ++ring) text += (ring >= t.stages ? at("slot_empty", j) : "") + at("load_issued", j);
            continue;
        }
        if (tiles > 0) text += " q_landed";
        if (tiles > 0 && !t.ping_pong) {
            for (int j = 0; j < tiles; ++j) {
                text += at("slot_full", j) + at("issued", j) + at("s_ready", j) + at("softmax", j) + at("rescaled", j) +
                        at("issued", j) + at("pv_done", j);
            }
        } else if (tiles > 0) {
            text += at("slot_full", 0) + at("turn", 0) + at("issued", 0) + at("s_ready", 0) + at("softmax", 0) +
                    at("rescaled", 0);
            for (int j = 1; j < tiles; ++j) {
                text += at("slot_full", j) + at("turn", j) + at("issued", j) + at("s_ready", j) + at("softmax", j) +
                        (t.overlap ? at("pv_done", j - 1) : "") + at("rescaled", j);
            }
            text += at("turn", tiles) + at("issued", tiles) + at("pv_done", tiles - 1);
        }
        text += " epilogue";
    }
    return text + " end";
}

}  // namespace

TEST_CASE("stage 11's instrumented build computes what the plain build does, bit for bit, and records its block's tiles in order") {
    uint64_t seed = 1500;
    for (int step : stage11::timeline_steps()) {
        if (!under_test(step)) continue;
        for (int64_t d : {64, 128}) {
            for (bool causal : {false, true}) {
                const Problem p = test::make_problem(2, 3, 700, 1000, d, causal);
                const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, seed++);
                const HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, Layout::BHND);
                const std::vector<float> lse(size_t(p.lse_elems()));
                cuda::DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                                        make_view3(lse.data(), p.batch, p.heads, p.seq_q));
                cuda::HalfTensors<__nv_bfloat16> half(p, Layout::BHND);
                half.load(dev.q, dev.k, dev.v);
                const size_t o_elems = size_t(p.q_elems()), lse_elems = size_t(p.lse_elems());
                std::vector<uint16_t> o_plain(o_elems), o_traced(o_elems);
                std::vector<float> lse_plain(lse_elems), lse_traced(lse_elems);
                // The instrumented build is the step's own kernel on every problem; where the plain
                // build runs small blocks instead (step 11 on: d = 64, causal, Nk <= 1024), the same
                // kernel's arithmetic without the marks is step 10's.
                const int plain_step = stage11::runs_small_blocks(p, step) ? 10 : step;
                stage11::attention_device(p, half.q, half.k, half.v, half.o, dev.lse, nullptr, plain_step);
                FA_CUDA_CHECK(cudaMemcpy(o_plain.data(), half.o.data, o_elems * 2, cudaMemcpyDeviceToHost));
                FA_CUDA_CHECK(cudaMemcpy(lse_plain.data(), dev.lse.data, lse_elems * 4, cudaMemcpyDeviceToHost));

                stage11::TimelineBlock t = stage11::timeline_block(p, step);
                const size_t count = size_t(1 + t.consumers) * stage11::kTimelineMarks;
                cuda::DeviceBuffer<cuda::TimelineMark> marks(count);
                std::vector<cuda::TimelineMark> host(count);
                // A persistent block takes its items at run time, and with as many blocks as items a
                // block may find none left: the run is repeated with the next block until one took some.
                for (int block = t.block; block < t.blocks; ++block) {
                    FA_CUDA_CHECK(cudaMemset(marks.data(), 0, marks.bytes()));
                    FA_CUDA_CHECK(cudaMemset(half.o.data, 0xff, o_elems * 2));  // NaN: an unwritten element shows
                    stage11::attention_device_timeline(p, half.q, half.k, half.v, half.o, dev.lse, nullptr, step, marks.data(),
                                                       block);
                    FA_CUDA_CHECK(cudaDeviceSynchronize());
                    marks.copy_to_host(host.data(), count);
                    if (!t.persistent || !items_of(marks_of(host, 1)).empty()) break;
                    t = stage11::timeline_block(p, step, block + 1);
                }
                FA_CUDA_CHECK(cudaMemcpy(o_traced.data(), half.o.data, o_elems * 2, cudaMemcpyDeviceToHost));
                FA_CUDA_CHECK(cudaMemcpy(lse_traced.data(), dev.lse.data, lse_elems * 4, cudaMemcpyDeviceToHost));

                const std::string where = "step " + std::to_string(step) + ", d " + std::to_string(d) + (causal ? ", causal" : "") +
                                          "; block " + std::to_string(t.block) + " of " + std::to_string(t.blocks) + ", " +
                                          std::to_string(t.end) + " key tiles";
                INFO(where);
                CHECK(o_traced == o_plain);
                CHECK(std::memcmp(lse_traced.data(), lse_plain.data(), lse_elems * 4) == 0);
                if (!t.persistent) CHECK(t.block == std::min(cuda::gpu_info().sm_count, t.blocks - 1));
                // The ring: two slots at step 3, three from ping-pong on; at d = 128 from step 15 on, two
                // slots for K and two for V.
                CHECK(t.stages == (d == 128 && step >= 15 ? 2 : step >= 4 ? 3 : 2));
                // The block's items: the one the grid gives it, or those a persistent block took.
                const std::vector<int> items = t.persistent ? items_of(marks_of(host, 1)) : std::vector<int>{t.end};
                REQUIRE(!items.empty());
                CHECK(items[0] > 0);
                // From step 16 on, a consumer warpgroup whose rows all lie past Nq (the second at
                // d = 128, the third at d = 64 in a head's last query tile, Nq = 700) passes its turns
                // and records no tile. Never the first consumer; and where one passes, so does every
                // consumer after it, whose rows lie further on.
                std::vector<bool> passed_before(items.size(), false);
                for (int g = 0; g <= t.consumers; ++g) {
                    const std::vector<cuda::TimelineMark> wg = marks_of(host, g);
                    INFO("warpgroup " << g);
                    const std::vector<bool> passed = g > 0 ? passed_items(wg) : std::vector<bool>{};
                    for (size_t i = 0; i < passed.size() && i < items.size(); ++i) {
                        if (passed[i]) CHECK((step >= 16 && g >= 2));
                        if (passed_before[i]) CHECK(passed[i]);
                        passed_before[i] = passed[i];
                    }
                    CHECK(codes_text(wg) == expected_codes(g, t, items, passed));
                    bool ordered = true;
                    for (size_t n = 1; n < wg.size(); ++n) ordered = ordered && wg[n].cycle >= wg[n - 1].cycle;
                    CHECK(ordered);
                    REQUIRE(wg.size() >= 2);
                    CHECK(wg.front().ns != 0);  // the first and last marks read the nanosecond clock
                    CHECK(wg.back().ns != 0);
                }
                // A run that names another block records that block's tiles (block 0: the heaviest
                // query tile under a causal mask, the first one otherwise).
                const stage11::TimelineBlock first = stage11::timeline_block(p, step, 0);
                FA_CUDA_CHECK(cudaMemset(marks.data(), 0, marks.bytes()));
                stage11::attention_device_timeline(p, half.q, half.k, half.v, half.o, dev.lse, nullptr, step, marks.data(), 0);
                FA_CUDA_CHECK(cudaDeviceSynchronize());
                marks.copy_to_host(host.data(), count);
                // (A persistent block 0 may take no item: then its consumers' marks are "start end".)
                const std::vector<int> first_items = first.persistent ? items_of(marks_of(host, 1)) : std::vector<int>{first.end};
                CHECK(codes_text(marks_of(host, 1)) == expected_codes(1, first, first_items));
            }
        }
    }
    const Problem p = test::make_problem(1, 2, 300, 300, 64);
    CHECK_THROWS_WITH_AS(stage11::timeline_block(p, 6), doctest::Contains("use --step 3, 4, 5, 8, 9"), InputError);
    CHECK_THROWS_WITH_AS(stage11::timeline_block(p, 8, 99), doctest::Contains("blocks 0 to 3"), InputError);
}

namespace {

/// Step `step`'s O (16-bit) and LSE on the device inputs of `half`, copied to the host.
template <class T>
std::pair<std::vector<uint16_t>, std::vector<float>> run_step(const Problem& p, cuda::HalfTensors<T>& half, View3<float> lse,
                                                              int step) {
    const size_t o_elems = size_t(p.q_elems()), lse_elems = size_t(p.lse_elems());
    FA_CUDA_CHECK(cudaMemset(half.o.data, 0xff, o_elems * 2));  // NaN: an unwritten element shows
    FA_CUDA_CHECK(cudaMemset(lse.data, 0xff, lse_elems * 4));
    stage11::attention_device(p, half.q, half.k, half.v, half.o, lse, nullptr, step);
    std::vector<uint16_t> o(o_elems);
    std::vector<float> l(lse_elems);
    FA_CUDA_CHECK(cudaMemcpy(o.data(), half.o.data, o_elems * 2, cudaMemcpyDeviceToHost));
    FA_CUDA_CHECK(cudaMemcpy(l.data(), lse.data, lse_elems * 4, cudaMemcpyDeviceToHost));
    return {o, l};
}

// The persistent grid's steps that change no arithmetic: each must give step 8's bits (a later step
// that changes none joins this list, and with it the case below). Step 17 changes it (a row's kept
// maximum changes P's rounding), so its several-items cases are the float64 ones above and below.
constexpr int kPersistentSteps[] = {9, 10, 11, 12, 13, 14, 15, 16};

// The persistent steps under test on `half`: O (16-bit words) and LSE equal step 8's bit for bit
// (steps 11 and after where they run their Br = 128/192 kernels; their small blocks sum in
// another order).
template <class T>
void check_persistent_steps(const Problem& p, cuda::HalfTensors<T>& half, View3<float> lse) {
    const auto step8 = run_step(p, half, lse, 8);
    for (int step : kPersistentSteps) {
        if (step >= 11 && stage11::runs_small_blocks(p, step)) continue;
        if (!under_test(step)) continue;
        INFO("step " << step);
        const auto persistent = run_step(p, half, lse, step);
        CHECK(persistent.first == step8.first);
        CHECK(std::memcmp(persistent.second.data(), step8.second.data(), step8.second.size() * 4) == 0);
    }
}

}  // namespace

TEST_CASE("stage 11 steps 9 to 16: blocks run several work items each and give step 8's bits, with tiles that see no key among them") {
    if (std::none_of(std::begin(kPersistentSteps), std::end(kPersistentSteps), under_test)) return;
    // More work items than SMs, so that each persistent block loops: (query tiles x B x H) items,
    // grid = SMs. Under a causal mask with Nq > Nk whole query tiles see no key (end = 0): the
    // producer skips them, the consumers write O = 0 and LSE = -inf, and the Q and ring phases
    // must still agree. Steps 8, 9 and 10 do the same arithmetic (only the epilogue's stores
    // differ), and so do steps 11 to 14 outside their small blocks (step 12 changes only when the
    // producer claims an item and who decodes it, step 13 only where O is staged before its store,
    // step 14 only the order of the epilogue's instructions, step 15 only which slots K and V
    // occupy and, at d = 128, that O is staged, step 16 only that warpgroups without a row before Nq
    // compute nothing, which Nq = 700 gives at both d and Nq = 1000 and 1024 at d = 64): their O and
    // LSE are compared bit for bit (the small blocks have their own case below).
    const int64_t shapes[][4] = {{4, 16, 1024, 1024}, {3, 20, 700, 900}, {2, 40, 1000, 300}};
    uint64_t seed = 1600;
    for (const auto& sh : shapes) {
        for (int64_t d : {64, 128}) {
            for (bool causal : {false, true}) {
                const Problem p = test::make_problem(sh[0], sh[1], sh[2], sh[3], d, causal);
                const Layout layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                const Inputs in = make_inputs(p, layout, InputKind::Normal, seed++);
                const HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, layout);
                const std::vector<float> lse(size_t(p.lse_elems()));
                cuda::DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                                        make_view3(lse.data(), p.batch, p.heads, p.seq_q));
                const stage11::TimelineBlock t = stage11::timeline_block(p, 9, 0);
                INFO(p.describe() << ", " << t.blocks << " blocks");
                CHECK(t.blocks == std::min(cuda::gpu_info().sm_count, int(p.batch * p.heads) * t.q_tiles));
                for (DType dtype : {DType::BF16, DType::FP16}) {
                    INFO(cuda::to_string(dtype));
                    if (dtype == DType::BF16) {
                        cuda::HalfTensors<__nv_bfloat16> half(p, layout);
                        half.load(dev.q, dev.k, dev.v);
                        check_persistent_steps(p, half, dev.lse);
                        if (!under_test(9)) continue;
                        // Each block's timeline lists the items it took, Q released and reloaded
                        // between them; with more items than blocks, some block took several.
                        const size_t count = size_t(1 + t.consumers) * stage11::kTimelineMarks;
                        cuda::DeviceBuffer<cuda::TimelineMark> marks(count);
                        std::vector<cuda::TimelineMark> host(count);
                        size_t most = 0;
                        for (int block = 0; block < t.blocks; ++block) {
                            FA_CUDA_CHECK(cudaMemset(marks.data(), 0, marks.bytes()));
                            stage11::attention_device_timeline(p, half.q, half.k, half.v, half.o, dev.lse, nullptr, 9, marks.data(),
                                                               block);
                            FA_CUDA_CHECK(cudaDeviceSynchronize());
                            marks.copy_to_host(host.data(), count);
                            const std::vector<int> items = items_of(marks_of(host, 1));
                            most = std::max(most, items.size());
                            for (int g = 0; g <= t.consumers; ++g) {
                                INFO("block " << block << ", warpgroup " << g);
                                CHECK(codes_text(marks_of(host, g)) == expected_codes(g, t, items));
                            }
                        }
                        // The recording block runs a few percent slower than the others, so it is among
                        // the last to ask for a second item: only with three items per block is one sure to be left for it.
                        if (int64_t(t.q_tiles) * p.batch * p.heads >= 3 * int64_t(t.blocks)) CHECK(most >= 2);
                    } else {
                        cuda::HalfTensors<__half> half(p, layout);
                        half.load(dev.q, dev.k, dev.v);
                        check_persistent_steps(p, half, dev.lse);
                    }
                }
            }
        }
    }
}

TEST_CASE("stage 11 steps 11, 12 and 17's small blocks: three per SM, each running several work items, match float64") {
    if (!under_test(11) && !under_test(12) && !under_test(17)) return;
    // d = 64, causal, Nk <= 1024: 2 x 20 heads x 11 query tiles of 64 rows = 440 items, more than
    // three blocks on each of 132 SMs, so some block takes a second item; Nq > Nk in one case, so
    // whole query tiles see no key and are skipped.
    uint64_t seed = 1700;
    for (const auto& size : {std::pair<int64_t, int64_t>{700, 900}, {900, 700}, {1024, 1024}}) {
        test::Case c;
        c.problem = test::make_problem(2, 20, size.first, size.second, 64, true);
        c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
        c.seed = seed++;
        for (int step : {11, 12, 17}) {  // 17: its own small blocks (the batched epilogue, the lazy rescale)
            if (!under_test(step)) continue;
            INFO(stage11::describe_config(c.problem, step));
            CHECK(stage11::runs_small_blocks(c.problem, step));
            check_case(c, DType::BF16, step);
            check_case(c, DType::FP16, step);
        }
    }
    // Steps 13 to 16 run step 12's small blocks (the same kernel, tested above) on the same problems.
    for (int step : {13, 14, 15, 16}) CHECK(stage11::runs_small_blocks(test::make_problem(2, 20, 1024, 1024, 64, true), step));
    CHECK_FALSE(stage11::runs_small_blocks(test::make_problem(1, 1, 1024, 1025, 64, true), 11));
    CHECK_FALSE(stage11::runs_small_blocks(test::make_problem(1, 1, 1024, 1024, 64, false), 11));
    CHECK_FALSE(stage11::runs_small_blocks(test::make_problem(1, 1, 1024, 1024, 128, true), 11));
    CHECK_FALSE(stage11::runs_small_blocks(test::make_problem(1, 1, 1024, 1024, 64, true), 10));
}

TEST_CASE("stage 11 refuses what it cannot do, naming the option") {
    const Problem p = test::make_problem(1, 1, 16, 16, 96);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 1);
    CHECK_THROWS_WITH_AS(test::run(stage11::attention, p, in, Layout::BHND), doctest::Contains("--head-dim 96"), InputError);
    CHECK_THROWS_WITH_AS(stage11::check_supported(test::make_problem(1, 1, 16, 16, 256), 1), doctest::Contains("use 64, 128"),
                         InputError);
    CHECK_THROWS_WITH_AS(stage11::check_supported(test::make_problem(1, 1, 16, 16, 64), 99), doctest::Contains("--step 99"),
                         InputError);
}
