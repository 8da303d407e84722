// Tests of common/: problem checks, views and layouts, inputs, metrics, the float64 reference,
// counts, timing, .npy files and the shared command line.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fa/cli.hpp"
#include "fa/counts.hpp"
#include "fa/error.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/npy.hpp"
#include "fa/precision.hpp"
#include "fa/problem.hpp"
#include "fa/reference.hpp"
#include "fa/tensor.hpp"
#include "fa/timing.hpp"
#include "support.hpp"

using namespace fa;
namespace fs = std::filesystem;

namespace {

// Shapes as (B, H, Nq, Nk, d, causal), the same helper the stage tests use.
using test::make_problem;

using test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A v1 .npy header for `dict`, padded to 64 bytes.
std::string npy_header(std::string dict) {
    const size_t unpadded = 10 + dict.size() + 1;
    dict.append((64 - unpadded % 64) % 64, ' ');
    dict.push_back('\n');
    std::string out = "\x93NUMPY";
    out.push_back(1);
    out.push_back(0);
    out.push_back(static_cast<char>(dict.size() & 0xff));
    out.push_back(static_cast<char>(dict.size() >> 8));
    return out + dict;
}

// `x` rounded to nearest even in a binary format with `fraction_bits` stored significand bits,
// smallest normal exponent `emin` and largest finite value `max_finite`, done slowly and exactly
// in double: the reference the hand-written bit conversions are held to.
double reference_round(double x, int fraction_bits, int emin, double max_finite) {
    if (!std::isfinite(x) || x == 0) return x;
    const int e = std::max(std::ilogb(x), emin);  // below emin the spacing stays that of emin: subnormals
    const double quantum = std::ldexp(1.0, e - fraction_bits);
    const double r = std::nearbyint(x / quantum) * quantum;  // the default rounding mode: ties to even
    return std::abs(r) > max_finite ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

int parse(std::vector<std::string> args, CommonOptions& options) {
    CLI::App app{"test"};
    add_common_options(app, options);
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return parse_command_line(app, static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("causal alignment is bottom-right") {
    // Nq == Nk: the usual lower triangle, row i sees keys 0..i.
    CHECK(visible_key_end(0, 4, 4, true) == 1);
    CHECK(visible_key_end(3, 4, 4, true) == 4);
    // Nq < Nk: the last query row sees every key.
    CHECK(visible_key_end(1, 2, 5, true) == 5);
    CHECK(visible_key_end(0, 2, 5, true) == 4);
    // Nq > Nk: the first Nq - Nk rows see nothing.
    CHECK(visible_key_end(0, 5, 2, true) == 0);
    CHECK(visible_key_end(2, 5, 2, true) == 0);
    CHECK(visible_key_end(3, 5, 2, true) == 1);
    CHECK(visible_key_end(4, 5, 2, true) == 2);
    // Non-causal: everything.
    CHECK(visible_key_end(0, 5, 2, false) == 2);
    CHECK(make_problem(1, 1, 4, 4, 8, true).visible_pairs_per_head() == 10);
}

TEST_CASE("problem validation names the option") {
    CHECK_NOTHROW(make_problem(1, 1, 1, 1, 1).validate());
    auto message = [](const Problem& p) {
        try {
            p.validate();
        } catch (const InputError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK(message(make_problem(0, 1, 1, 1, 1)).find("--batch") != std::string::npos);
    CHECK(message(make_problem(1, 1, 1, 1, 0)).find("--head-dim") != std::string::npos);
    CHECK(message(make_problem(1, 1, 1, 0, 1)).find("--seq-k") != std::string::npos);
    Problem huge = make_problem(65536, 4096, 1 << 24, 1 << 24, 65536);
    CHECK(message(huge).find("64-bit") != std::string::npos);
    Problem bad_scale = make_problem(1, 1, 1, 1, 1);
    bad_scale.scale = std::numeric_limits<double>::infinity();
    CHECK(message(bad_scale).find("--scale") != std::string::npos);
    CHECK(make_problem(1, 1, 1, 1, 64).softmax_scale() == doctest::Approx(0.125));
}

TEST_CASE("views read both layouts; the logical tensor does not depend on the layout") {
    // Shape and stride: a (B, H, N, d) = (2, 3, 4, 5) tensor.
    CHECK(dense_strides(2, 3, 4, 5, Layout::BHND) == std::array<int64_t, 4>{60, 20, 5, 1});
    CHECK(dense_strides(2, 3, 4, 5, Layout::BNHD) == std::array<int64_t, 4>{60, 5, 15, 1});
    const Problem p = make_problem(2, 3, 7, 9, 5);
    const Inputs a = make_inputs(p, Layout::BHND, InputKind::Normal, 11);
    const Inputs b = make_inputs(p, Layout::BNHD, InputKind::Normal, 11);
    CHECK(a.q.logical() == b.q.logical());
    CHECK(a.v.logical() == b.v.logical());
    CHECK(a.q.storage != b.q.storage);  // same values, different places in memory
    // Element (1, 2, 3, 4) lives where the strides say.
    const auto& v = b.q.view;
    CHECK(&v(1, 2, 3, 4) == b.q.storage.data() + (1 * 7 * 3 * 5 + 3 * 3 * 5 + 2 * 5 + 4));
    // Copies keep their own storage.
    HostTensor copy = a.q;
    copy.view(0, 0, 0, 0) += 1.0f;
    CHECK(copy.view(0, 0, 0, 0) != a.q.view(0, 0, 0, 0));
}

TEST_CASE("inputs are seeded, never zeros, and large inputs are large") {
    const Problem p = make_problem(1, 2, 33, 17, 8);
    const Inputs a = make_inputs(p, Layout::BHND, InputKind::Normal, 5);
    const Inputs b = make_inputs(p, Layout::BHND, InputKind::Normal, 5);
    const Inputs c = make_inputs(p, Layout::BHND, InputKind::Normal, 6);
    CHECK(a.k.storage == b.k.storage);
    CHECK(a.k.storage != c.k.storage);
    int zeros = 0;
    for (float x : a.q.storage) zeros += x == 0.0f;
    CHECK(zeros == 0);
    const Inputs big = make_inputs(p, Layout::BHND, InputKind::Large, 5);
    float max_abs = 0;
    for (float x : big.q.storage) max_abs = std::max(max_abs, std::abs(x));
    CHECK(max_abs > 20.0f);
}

TEST_CASE("dO is seeded, shaped like o, never zeros, independent of the layout and of q, k, v") {
    const Problem p = make_problem(2, 3, 19, 5, 7);
    const HostTensor a = make_output_gradient(p, Layout::BHND, 9);
    const HostTensor b = make_output_gradient(p, Layout::BNHD, 9);
    const HostTensor c = make_output_gradient(p, Layout::BHND, 10);
    CHECK(a.view.shape == std::array<int64_t, 4>{2, 3, 19, 7});
    CHECK(a.logical() == b.logical());
    CHECK(a.logical() != c.logical());
    int zeros = 0;
    for (float x : a.storage) zeros += x == 0.0f;
    CHECK(zeros == 0);
    // A stream of its own: not a copy of q (same shape) for this seed or the next ones.
    for (uint64_t seed : {9u, 10u, 11u, 12u}) CHECK(make_inputs(p, Layout::BHND, InputKind::Normal, seed).q.logical() != a.logical());
}

TEST_CASE("inputs holding NaN or inf are refused with the count and the first index, in logical order") {
    const Problem p = make_problem(1, 2, 5, 5, 4);
    Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, 3);
    CHECK_NOTHROW(require_finite(in.q.cview(), "q"));
    in.q.view(0, 1, 2, 3) = std::numeric_limits<float>::infinity();  // flat (1 * 5 + 2) * 4 + 3 = 31
    in.q.view(0, 1, 4, 0) = std::nanf("");
    CHECK_THROWS_WITH_AS(require_finite(in.q.cview(), "q.npy"),
                         "q.npy: 2 of 40 values are NaN or inf (first at flat index 31, (b=0, h=1, n=2, x=3))", InputError);
}

TEST_CASE("metrics") {
    const std::vector<double> ref{1.0, -2.0, 3.0, -std::numeric_limits<double>::infinity()};
    SUBCASE("exact") {
        const Metrics m = compare(std::vector<float>{1.0f, -2.0f, 3.0f, -std::numeric_limits<float>::infinity()}, ref);
        CHECK(m.max_abs == 0);
        CHECK(m.nonfinite == 0);  // matching -inf is exact
        CHECK(m.cosine == doctest::Approx(1.0));
        CHECK(m.count == 3);
    }
    SUBCASE("errors") {
        const Metrics m = compare(std::vector<float>{1.5f, -2.0f, 3.0f, -std::numeric_limits<float>::infinity()}, ref);
        CHECK(m.max_abs == doctest::Approx(0.5));
        CHECK(m.mean_abs == doctest::Approx(0.5 / 3));
        CHECK(m.max_rel == doctest::Approx(0.5).epsilon(1e-5));
        CHECK(m.rel_l2 == doctest::Approx(0.5 / std::sqrt(14.0)));
        CHECK(m.worst_index == 0);
        CHECK_FALSE(passes(m, Tolerance{0.1, 0.1}));
        CHECK(passes(m, Tolerance{0.5, 0.2}));
        CHECK(passes(m, Tolerance{0.5}));  // no relative limit
    }
    SUBCASE("NaN and a wrong infinity are counted") {
        const Metrics m = compare(std::vector<float>{std::nanf(""), -2.0f, 3.0f, std::numeric_limits<float>::infinity()}, ref);
        CHECK(m.nonfinite == 2);
        CHECK_FALSE(passes(m, Tolerance{1e9, 1e9}));
    }
    SUBCASE("sizes that differ fail") {
        CHECK(compare(std::vector<float>{1.0f}, ref).nonfinite == 3);
    }
}

TEST_CASE("the float64 reference: softmax of [3, 2, 5, 1]") {
    // One query, four keys, d = 1, scale 1: the scores are q * k = [3, 2, 5, 1].
    Problem p = make_problem(1, 1, 1, 4, 1);
    p.scale = 1.0;
    std::vector<float> q{1.0f}, k{3, 2, 5, 1}, v{10, 20, 30, 40};
    const Reference ref = reference_attention(p, make_view<const float>(q.data(), 1, 1, 1, 1, Layout::BHND),
                                              make_view<const float>(k.data(), 1, 1, 4, 1, Layout::BHND),
                                              make_view<const float>(v.data(), 1, 1, 4, 1, Layout::BHND));
    const double e[] = {std::exp(3.0), std::exp(2.0), std::exp(5.0), std::exp(1.0)};
    const double sum = e[0] + e[1] + e[2] + e[3];
    CHECK(ref.o[0] == doctest::Approx((10 * e[0] + 20 * e[1] + 30 * e[2] + 40 * e[3]) / sum));
    CHECK(ref.lse[0] == doctest::Approx(std::log(sum)));
    // Causal with Nq > Nk: the first row sees nothing.
    Problem c = make_problem(1, 1, 2, 1, 1, true);
    std::vector<float> q2{1, 2};
    const Reference r2 = reference_attention(c, make_view<const float>(q2.data(), 1, 1, 2, 1, Layout::BHND),
                                             make_view<const float>(k.data(), 1, 1, 1, 1, Layout::BHND),
                                             make_view<const float>(v.data(), 1, 1, 1, 1, Layout::BHND));
    CHECK(r2.o[0] == 0.0);
    CHECK(std::isinf(r2.lse[0]));
    CHECK(r2.o[1] == doctest::Approx(10.0));
    CHECK(r2.lse[1] == doctest::Approx(2.0 * 3.0 / 1.0));
}

TEST_CASE("counts") {
    const Problem p = make_problem(2, 4, 1024, 1024, 64);
    CHECK(attention_flops(p) == doctest::Approx(4.0 * 2 * 4 * 1024 * 1024 * 64));
    Problem c = p;
    c.causal = true;
    CHECK(attention_flops(c) == doctest::Approx(attention_flops(p) / 2));
    CHECK(attention_flops_backward(p) == doctest::Approx(2.5 * attention_flops(p)));
    CHECK(attention_flops_backward(c) == doctest::Approx(attention_flops_backward(p) / 2));
    CHECK(attention_flops_fwd_bwd(p) == doctest::Approx(3.5 * attention_flops(p)));
    CHECK(attention_min_bytes(p) == doctest::Approx(4.0 * (4.0 * 2 * 4 * 1024 * 64) + 4.0 * 2 * 4 * 1024));
    CHECK(score_matrix_bytes(p) == doctest::Approx(4.0 * 2 * 4 * 1024 * 1024));
    CHECK(format_bytes(512) == "512 B");
    CHECK(format_bytes(1536) == "1.50 KiB");
    CHECK(format_flops(2.5e12) == "2.50 TFLOP");
}

TEST_CASE("timing and memory") {
    const TimingStats s = summarize({5, 1, 3, 2, 4});
    CHECK(s.median_ms == 3);
    CHECK(s.min_ms == 1);
    CHECK(s.max_ms == 5);
    CHECK(summarize({1, 2, 3, 4}).median_ms == doctest::Approx(2.5));
    int calls = 0;
    const TimingStats t = time_host([&] { ++calls; }, 2, 7);
    CHECK(calls == 9);
    CHECK(t.samples_ms.size() == 7);
    CHECK(current_rss_bytes() > 0);
    reset_peak_rss();
    std::vector<char> block(64 << 20, 1);  // 64 MiB, touched
    // The block escapes to an empty asm that may read memory: otherwise a compiler may drop the
    // allocation, which nothing reads (Clang does), and the test would measure nothing.
    asm volatile("" : : "r"(block.data()) : "memory");
    CHECK(peak_rss_bytes() >= int64_t(block.size()));
}

TEST_CASE(".npy round trip, float16, and malformed files") {
    TempDir dir;
    const std::vector<float> data{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
    write_npy(dir.file("a.npy"), {1, 2, 3}, data);
    const NpyArray a = read_npy(dir.file("a.npy"));
    CHECK(a.shape == std::vector<int64_t>{1, 2, 3});
    CHECK(a.dtype == "<f4");
    CHECK(a.data == data);

    // float16: 1.0 = 0x3c00, -2.0 = 0xc000, 65504 = 0x7bff, smallest subnormal 0x0001.
    const uint16_t halves[] = {0x3c00, 0xc000, 0x7bff, 0x0001};
    write_bytes(dir.file("h.npy"), npy_header("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }") +
                                       std::string(reinterpret_cast<const char*>(halves), sizeof halves));
    const NpyArray h = read_npy(dir.file("h.npy"));
    CHECK(h.data[0] == 1.0f);
    CHECK(h.data[1] == -2.0f);
    CHECK(h.data[2] == 65504.0f);
    CHECK(h.data[3] == doctest::Approx(5.960464477539063e-08));

    auto error_of = [](const std::string& path) {
        try {
            read_npy(path);
        } catch (const InputError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    auto error_of_bytes = [](const std::string& bytes) {
        try {
            read_npy_bytes(bytes, "mem.npy");
        } catch (const InputError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK(error_of(dir.file("missing.npy")).find("cannot open") != std::string::npos);
    write_bytes(dir.file("magic.npy"), "hello world, this is not numpy");
    CHECK(error_of(dir.file("magic.npy")).find("magic") != std::string::npos);
    write_bytes(dir.file("short.npy"), npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }").substr(0, 20));
    CHECK(error_of(dir.file("short.npy")).find("truncated") != std::string::npos);
    write_bytes(dir.file("data.npy"), npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }") + "abcd");
    CHECK(error_of(dir.file("data.npy")).find("truncated") != std::string::npos);
    write_bytes(dir.file("f8.npy"), npy_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }") + std::string(8, '\0'));
    CHECK(error_of(dir.file("f8.npy")).find("float32") != std::string::npos);
    write_bytes(dir.file("fo.npy"), npy_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }") + std::string(4, '\0'));
    CHECK(error_of(dir.file("fo.npy")).find("Fortran") != std::string::npos);
    write_bytes(dir.file("shape.npy"), npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-3, 2), }"));
    CHECK(error_of(dir.file("shape.npy")).find("shape") != std::string::npos);
    write_bytes(dir.file("nodescr.npy"), npy_header("{'fortran_order': False, 'shape': (1,), }") + std::string(4, '\0'));
    CHECK(error_of(dir.file("nodescr.npy")).find("descr") != std::string::npos);
    // A shape whose size overflows int64 is refused from the file size, before any allocation.
    write_bytes(dir.file("huge.npy"),
                npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000000, 100000000000000), }") + "abcd");
    CHECK(error_of(dir.file("huge.npy")).find("truncated: the shape needs 4e+28 bytes of data but the file has 4") !=
          std::string::npos);
    // A 0-d array (shape ()) still holds one element.
    write_bytes(dir.file("scalar.npy"), npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (), }") + "ab");
    CHECK(error_of(dir.file("scalar.npy")).find("truncated") != std::string::npos);
    // A header length beyond the file.
    std::string lying = npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }") + "abcd";
    lying[8] = '\xff';
    lying[9] = '\x7f';
    CHECK(error_of_bytes(lying).find("truncated .npy header (header length 32767") != std::string::npos);

    // The same bytes in memory: the same array.
    std::ifstream in(dir.file("a.npy"), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const NpyArray m = read_npy_bytes(bytes, "a.npy");
    CHECK(m.shape == a.shape);
    CHECK(m.data == data);
}

TEST_CASE("bf16 and fp16: round to nearest even, subnormals, overflow, NaN, against an exact reference") {
    const double bf16_max = 0x1.fep127, fp16_max = 65504.0;
    // Every 997th float32 bit pattern (4.3 million values, every exponent, both signs).
    for (uint64_t b = 0; b <= 0xffffffffu; b += 997) {
        const float x = std::bit_cast<float>(uint32_t(b));
        const float bf = round_to(Precision::BFloat16, x), fp = round_to(Precision::Float16, x);
        if (!same(bf, float(reference_round(x, 7, -126, bf16_max)))) FAIL_CHECK("bf16 of " << x << " bits " << b);
        if (!same(fp, float(reference_round(x, 10, -14, fp16_max)))) FAIL_CHECK("fp16 of " << x << " bits " << b);
    }
    // Every 16-bit pattern survives the round trip.
    for (uint32_t h = 0; h <= 0xffff; ++h) {
        const float fb = bf16_bits_to_float(uint16_t(h)), fh = half_to_float(uint16_t(h));
        if (!std::isnan(fb) && float_to_bf16_bits(fb) != h) FAIL_CHECK("bf16 pattern " << h);
        if (!std::isnan(fh) && float_to_fp16_bits(fh) != h) FAIL_CHECK("fp16 pattern " << h);
        if (std::isnan(fh)) CHECK(std::isnan(half_to_float(float_to_fp16_bits(fh))));
    }
    // The cases that go wrong by hand: ties, the edge of overflow, the subnormal boundary.
    CHECK(round_to(Precision::Float16, 1.0f + 0x1p-11f) == 1.0f);                   // tie, to even
    CHECK(round_to(Precision::Float16, 1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);     // tie, to even (up)
    CHECK(round_to(Precision::Float16, 65519.0f) == 65504.0f);
    CHECK(std::isinf(round_to(Precision::Float16, 65520.0f)));
    CHECK(round_to(Precision::Float16, 0x1p-25f) == 0.0f);                          // tie between 0 and 2^-24
    CHECK(round_to(Precision::Float16, 0x1.000002p-25f) == 0x1p-24f);
    CHECK(round_to(Precision::Float16, 3 * 0x1p-25f) == 2 * 0x1p-24f);              // 1.5 units: to even, 2
    CHECK(std::signbit(round_to(Precision::Float16, -1e-30f)));                       // -0 keeps its sign
    CHECK(round_to(Precision::BFloat16, 1.0f + 0x1p-8f) == 1.0f);
    CHECK(round_to(Precision::BFloat16, 1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    CHECK(std::isinf(round_to(Precision::BFloat16, std::numeric_limits<float>::max())));
    CHECK(round_to(Precision::BFloat16, 0x1p-133f) == 0x1p-133f);                     // smallest bf16 subnormal
    CHECK(std::isnan(round_to(Precision::BFloat16, std::nanf(""))));
    CHECK(round_to(Precision::Float32, 0.1f) == 0.1f);
    CHECK(unit_roundoff(Precision::Float32) == 0x1p-24);
    CHECK(unit_roundoff(Precision::BFloat16) == 0x1p-8);
    CHECK(unit_roundoff(Precision::Float16) == 0x1p-11);
}

TEST_CASE("command line: ranges, choices and defaults") {
    CommonOptions o;
    CHECK(parse({}, o) == -1);
    CHECK(o.problem.seq_q == 512);
    CHECK(o.layout == Layout::BHND);
    CommonOptions o2;
    CHECK(parse({"--seq-q", "7", "--seq-k", "9", "--layout", "bnhd", "--inputs", "large", "--causal", "--scale", "0.5"}, o2) == -1);
    CHECK(o2.problem.seq_q == 7);
    CHECK(o2.problem.seq_k == 9);
    CHECK(o2.layout == Layout::BNHD);
    CHECK(o2.inputs == InputKind::Large);
    CHECK(o2.problem.causal);
    CHECK(*o2.problem.scale == 0.5);
    CommonOptions bad;
    CHECK(parse({"--batch", "0"}, bad) == kExitBadInput);
    CHECK(parse({"--heads", "-3"}, bad) == kExitBadInput);
    CHECK(parse({"--seq-q", "abc"}, bad) == kExitBadInput);
    CHECK(parse({"--layout", "nchw"}, bad) == kExitBadInput);
    CHECK(parse({"--scale", "inf"}, bad) == kExitBadInput);
    CHECK(parse({"--repeat", "0"}, bad) == kExitBadInput);
    CHECK(parse({"--no-such-option"}, bad) == kExitBadInput);
    CHECK(parse({"--load", "/no/such/dir"}, bad) == kExitBadInput);
    CHECK(parse({"--help"}, bad) == 0);
}
