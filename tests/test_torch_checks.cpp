// Tests of the PyTorch operator's host half (python/csrc/checks.hpp), without a GPU or PyTorch:
// every refusal names the argument and what is allowed; the views reach the kernels with the
// strides PyTorch gives, in both layouts, a size-1 axis's stride replaced; each call is routed to
// the stage the lesson's measurements say is fastest for it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "checks.hpp"
#include "fa/error.hpp"
#include "support.hpp"

using namespace fa;
using namespace fa::pytorch;

namespace {

using test::refusal;

alignas(16) char device_memory[16];  // the checks read the pointer's alignment only

// A dense tensor of `sizes`, as PyTorch lays it out (row-major), on cuda:0.
TensorArg dense(const std::string& name, std::vector<int64_t> sizes, Element e = Element::BF16) {
    TensorArg t;
    t.name = name, t.data = device_memory, t.element = e, t.cuda = true, t.device = 0, t.sizes = sizes;
    t.strides.assign(sizes.size(), 1);
    for (size_t i = sizes.size() - 1; i-- > 0;) t.strides[i] = t.strides[i + 1] * sizes[i + 1];
    return t;
}

// flash-attn's (B, N, H, d) tensor seen as the logical (B, H, N, d) view (x.transpose(1, 2)).
TensorArg bnhd(const std::string& name, int64_t b, int64_t h, int64_t n, int64_t d) {
    TensorArg t = dense(name, {b, n, h, d});
    std::swap(t.sizes[1], t.sizes[2]);
    std::swap(t.strides[1], t.strides[2]);
    return t;
}

}  // namespace

TEST_CASE("a plain dense call in either layout is taken, its problem and options as given") {
    CallOptions o;
    o.causal = true;
    for (bool flash_layout : {false, true}) {
        CAPTURE(flash_layout);
        const TensorArg q = flash_layout ? bnhd("q", 2, 8, 77, 64) : dense("q", {2, 8, 77, 64});
        const TensorArg k = flash_layout ? bnhd("k", 2, 2, 93, 64) : dense("k", {2, 2, 93, 64});
        const TensorArg v = flash_layout ? bnhd("v", 2, 2, 93, 64) : dense("v", {2, 2, 93, 64});
        const DenseCall c = check_dense(q, k, v, o, true);
        CHECK(c.problem.batch == 2);
        CHECK(c.problem.heads == 8);
        CHECK(c.problem.seq_q == 77);
        CHECK(c.problem.seq_k == 93);
        CHECK(c.problem.causal);
        CHECK(!c.problem.scale.has_value());  // scale 0: 1/sqrt(d)
        CHECK(c.options.kv_heads == 2);
        const View4<const float> view = view4<const float>(q);
        CHECK(view.stride[3] == 1);
        CHECK(view.stride[1] == (flash_layout ? 64 : 77 * 64));
        CHECK(view.stride[2] == (flash_layout ? 8 * 64 : 64));
    }
}

TEST_CASE("a size-1 axis gets the tensor's extent as its stride, whatever PyTorch left there") {
    TensorArg q = dense("q", {1, 4, 10, 64});
    q.strides[0] = 3;  // any value: the axis is never stepped along
    CHECK(refusal([&] { check_dense(q, dense("k", {1, 4, 10, 64}), dense("v", {1, 4, 10, 64}), {}, false); }) == "");
    CHECK(view4<const float>(q).stride[0] == 4 * 10 * 64);
}

TEST_CASE("a packed (total, H, d) tensor is the view (1, H, total, d) of make_packed_view()") {
    const View4<const float> v = packed_view<const float>(dense("q", {100, 8, 64}));
    CHECK(v.shape == std::array<int64_t, 4>{1, 8, 100, 64});
    CHECK(v.stride[1] == 64);
    CHECK(v.stride[2] == 8 * 64);
    CHECK(v.stride[3] == 1);
}

TEST_CASE("each refusal of a dense call names the argument and what is allowed") {
    const TensorArg q = dense("q", {2, 4, 50, 64}), k = dense("k", {2, 4, 60, 64}), v = dense("v", {2, 4, 60, 64});
    const auto msg = [](TensorArg q2, TensorArg k2, TensorArg v2, CallOptions o = {}, bool backward = false) {
        return refusal([&] { check_dense(q2, k2, v2, o, backward); });
    };
    CHECK(msg(q, k, v) == "");
    CHECK(msg(dense("q", {2, 4, 50, 64}, Element::FP32), k, v).find("q is float32: the kernels take bfloat16 or float16") == 0);
    CHECK(msg(q, dense("k", {2, 4, 60, 64}, Element::FP16), v).find("k is float16 but q is bfloat16") == 0);
    TensorArg cpu = v;
    cpu.cuda = false;
    CHECK(msg(q, k, cpu).find("v is not on a CUDA device") == 0);
    TensorArg other = k;
    other.device = 1;
    CHECK(msg(q, other, v).find("k is on cuda:1 but q is on cuda:0") == 0);
    CHECK(msg(dense("q", {2, 4, 50, 96}), dense("k", {2, 4, 60, 96}), dense("v", {2, 4, 60, 96}))
              .find("head dimension 96 (the last dimension of q) is not supported by stage 07's forward: use 32, 64, 128 or 256") == 0);
    CHECK(msg(dense("q", {2, 4, 50, 256}), dense("k", {2, 4, 60, 256}), dense("v", {2, 4, 60, 256}), {}, true)
              .find("not supported by stage 09's backward: use 32, 64 or 128") != std::string::npos);
    CHECK(msg(dense("q", {2, 6, 50, 64}), k, v).find("q has 6 heads and k, v have 4") == 0);
    CHECK(msg(q, k, dense("v", {2, 4, 61, 64})).find("k (2, 4, 60, 64) and v (2, 4, 61, 64) must have one shape") == 0);
    CHECK(msg(dense("q", {2, 4, 50}), k, v).find("q has 3 dimensions (2, 4, 50); expected 4") == 0);
    CHECK(msg(dense("q", {2, 4, 0, 64}), k, v).find("has an empty dimension") != std::string::npos);
    TensorArg strided = q;
    strided.strides[3] = 2;
    CHECK(msg(strided, k, v).find("q has feature stride 2") == 0);
    TensorArg odd = k;
    odd.strides[2] = 68 + 1;
    CHECK(msg(q, odd, v).find("k has stride 69 in dimension 2: the strides other than the features' must be multiples of 8") == 0);
    TensorArg unaligned = v;
    unaligned.data = device_memory + 2;
    CHECK(msg(q, k, unaligned).find("v does not start on a 16-byte boundary") == 0);
    CallOptions o;
    o.window_left = -2;
    CHECK(msg(q, k, v, o).find("window_left -2 is not allowed") == 0);
    o = {};
    o.softcap = -1;
    CHECK(msg(q, k, v, o).find("softcap -1") == 0);
    o = {};
    o.dropout_p = 1.0;
    CHECK(msg(q, k, v, o).find("dropout_p 1.0") == 0);
    o = {};
    o.scale = std::numeric_limits<double>::infinity();
    CHECK(msg(q, k, v, o).find("scale inf is not finite") == 0);
}

TEST_CASE("the backward's other tensors are checked against q") {
    const TensorArg q = dense("q", {2, 4, 50, 64});
    CHECK(refusal([&] { check_like(dense("out", {2, 4, 50, 64}), q.sizes, Element::BF16, 0, true); }) == "");
    CHECK(refusal([&] { check_like(dense("dout", {2, 4, 51, 64}), q.sizes, Element::BF16, 0, true); })
              .find("dout is (2, 4, 51, 64); expected (2, 4, 50, 64)") == 0);
    CHECK(refusal([&] { check_like(dense("lse", {2, 4, 50}, Element::BF16), {2, 4, 50}, Element::FP32, 0, false); })
              .find("lse is bfloat16; expected float32") == 0);
    TensorArg lse = dense("lse", {2, 4, 50}, Element::FP32);
    std::swap(lse.strides[0], lse.strides[1]);
    CHECK(refusal([&] { check_like(lse, {2, 4, 50}, Element::FP32, 0, false); }).find("lse must be contiguous") == 0);
}

TEST_CASE("a packed call: cu_seqlens checked, then their values against the totals and the longest lengths") {
    const TensorArg q = dense("q", {30, 8, 64}), k = dense("k", {40, 2, 64}), v = dense("v", {40, 2, 64});
    const TensorArg cq = dense("cu_seqlens_q", {3}, Element::INT32), ck = dense("cu_seqlens_k", {3}, Element::INT32);
    CallOptions o;
    o.causal = true;
    const auto msg = [&](std::vector<int32_t> cu_q, std::vector<int32_t> cu_k, int64_t max_q, int64_t max_k,
                         TensorArg cq2, TensorArg ck2) {
        return refusal([&] { check_varlen(q, k, v, cq2, ck2, cu_q, cu_k, max_q, max_k, o, true); });
    };
    CHECK(msg({0, 10, 30}, {0, 15, 40}, 20, 25, cq, ck) == "");
    const VarlenCall c = check_varlen(q, k, v, cq, ck, {0, 10, 30}, {0, 15, 40}, 20, 25, o, true);
    CHECK(c.problem.heads_q == 8);
    CHECK(c.problem.heads_k == 2);
    CHECK(c.problem.window.right == 0);  // causal is the window (-1, 0)
    CHECK(c.max.q == 20);
    CHECK(msg({0, 10, 30}, {0, 15, 40}, 19, 25, cq, ck).find("more than max_seqlen_q = 19") != std::string::npos);
    CHECK(msg({0, 10, 29}, {0, 15, 40}, 20, 25, cq, ck).find("cu_seqlens") != std::string::npos);
    CHECK(msg({0, 10, 30}, {0, 15, 40}, 20, 25, dense("cu_seqlens_q", {3}, Element::Other), ck)
              .find("cu_seqlens_q is another dtype: cu_seqlens are int32") == 0);
    CHECK(msg({0, 10, 30}, {0, 15, 40}, 20, 25, cq, dense("cu_seqlens_k", {4}, Element::INT32))
              .find("cu_seqlens_q has 3 entries and cu_seqlens_k 4") == 0);
}

TEST_CASE("the routes: Hopper's stages for the plain calls they are faster on, stages 07 and 09 for the rest") {
    const auto call = [](int64_t d, int64_t kv_heads, CallOptions o = {}) {
        return check_dense(dense("q", {1, 4, 100, d}), dense("k", {1, kv_heads, 100, d}), dense("v", {1, kv_heads, 100, d}),
                           o, false);
    };
    CHECK(forward_route(call(64, 4), true) == Route::Stage11);
    CHECK(forward_route(call(128, 4), true) == Route::Stage11);
    CHECK(forward_route(call(64, 4), false) == Route::Stage07);
    CHECK(forward_route(call(32, 4), true) == Route::Stage07);
    CHECK(forward_route(call(64, 2), true) == Route::Stage07);  // grouped heads: stage 10's switches
    CallOptions o;
    o.softcap = 30;
    CHECK(forward_route(call(64, 4, o), true) == Route::Stage07);
    o = {};
    o.dropout_p = 0.1;
    CHECK(forward_route(call(64, 4, o), true) == Route::Stage07);
    o = {};
    o.window_left = 10;
    CHECK(forward_route(call(64, 4, o), true) == Route::Stage07);
    o = {};
    o.causal = true;  // causal alone is plain
    CHECK(forward_route(call(64, 4, o), true) == Route::Stage11);
    CHECK(backward_route(call(64, 4, o), true, false) == Route::Stage12);
    CHECK(backward_route(call(64, 4), true, true) == Route::Stage09);   // the deterministic order is stage 09's
    CHECK(backward_route(call(128, 4), true, false) == Route::Stage09); // stage 12 is slower at d = 128
    CHECK(backward_route(call(64, 2), true, false) == Route::Stage09);
    CHECK(backward_route(call(64, 4), false, false) == Route::Stage09);
}
