#include "checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "fa/error.hpp"

namespace fa::pytorch {

namespace {

std::string shape_text(const std::vector<int64_t>& sizes) {
    std::ostringstream s;
    s << "(";
    for (size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i];
    s << ")";
    return s.str();
}

std::string dims_text(const std::vector<int>& dims) {
    std::string out;
    for (size_t i = 0; i < dims.size(); ++i) {
        out += (i == 0 ? "" : i + 1 == dims.size() ? " or " : ", ") + std::to_string(dims[i]);
    }
    return out;
}

void require(bool ok, const std::string& message) {
    if (!ok) throw InputError(message);
}

/// The element type, device and rank every tensor argument of a call is checked for first.
void check_tensor(const TensorArg& t, size_t rank, const std::string& rank_words) {
    require(t.cuda, t.name + " is not on a CUDA device: the kernels read device memory (move it with .cuda())");
    require(t.sizes.size() == rank && t.strides.size() == rank,
            t.name + " has " + std::to_string(t.sizes.size()) + " dimensions " + shape_text(t.sizes) + "; expected " +
                std::to_string(rank) + " " + rank_words);
    for (const int64_t s : t.sizes) require(s >= 1, t.name + " " + shape_text(t.sizes) + " has an empty dimension");
}

/// The kernels copy 16 bytes at a time: contiguous features, other strides multiples of 8
/// elements, a 16-byte aligned start. Size-1 axes are left out (their stride is never used).
void check_rows(const TensorArg& t) {
    const size_t last = t.sizes.size() - 1;
    require(t.strides[last] == 1 || t.sizes[last] == 1,
            t.name + " has feature stride " + std::to_string(t.strides[last]) +
                ": its last dimension (d) must be contiguous (stride 1); call .contiguous() on it");
    for (size_t i = 0; i < last; ++i) {
        require(t.sizes[i] == 1 || t.strides[i] % 8 == 0,
                t.name + " has stride " + std::to_string(t.strides[i]) + " in dimension " + std::to_string(i) +
                    ": the strides other than the features' must be multiples of 8 elements (16 bytes), as "
                    "dense tensors' are; call .contiguous() on it");
        require(t.strides[i] >= 0, t.name + " has a negative stride in dimension " + std::to_string(i));
    }
    require(reinterpret_cast<uintptr_t>(t.data) % 16 == 0,
            t.name + " does not start on a 16-byte boundary (a view with an odd offset): call .contiguous() on it");
}

void check_options(const CallOptions& o) {
    require(std::isfinite(o.scale), "scale " + std::to_string(o.scale) + " is not finite");
    for (const auto& [name, bound] : {std::pair{"window_left", o.window_left}, std::pair{"window_right", o.window_right}}) {
        require(bound >= -1, std::string(name) + " " + std::to_string(bound) +
                                 " is not allowed: a bound is a number of keys (0 or more), or -1 for none");
    }
    require(std::isfinite(o.softcap) && o.softcap >= 0.0,
            "softcap " + std::to_string(o.softcap) + " is not allowed: give 0 (off) or a positive cap");
    require(o.dropout_p >= 0.0 && o.dropout_p < 255.5 / 256.0,
            "dropout_p " + std::to_string(o.dropout_p) +
                " is not allowed: give a probability from 0 up to (not including) 255.5/256, "
                "the kernels' dropout comparing one random byte per entry");
    require(o.offset >= 0 && o.offset <= int64_t(UINT32_MAX), "offset " + std::to_string(o.offset) + " must fit in 32 bits");
}

void check_head_dim(int64_t d, bool backward, const std::string& what) {
    const std::vector<int>& dims = backward ? backward_head_dims() : forward_head_dims();
    require(std::find(dims.begin(), dims.end(), int(d)) != dims.end(),
            "head dimension " + std::to_string(d) + " (the last dimension of " + what + ") is not supported by " +
                (backward ? "stage 09's backward" : "stage 07's forward") + ": use " + dims_text(dims));
}

/// k and v against q: the same element type and device; k and v of one shape.
void check_same(const TensorArg& q, const TensorArg& t) {
    require(t.element == q.element, t.name + " is " + to_string(t.element) + " but q is " + to_string(q.element) +
                                        ": q, k and v must have one dtype");
    require(t.device == q.device, t.name + " is on cuda:" + std::to_string(t.device) + " but q is on cuda:" +
                                      std::to_string(q.device) + ": every tensor of a call must be on one device");
}

/// What a dense and a packed call check alike of q, k and v, each of `rank` dimensions (`shape`
/// names them in messages), the heads at axis 1 and d last: a 16-bit type, one dtype and device,
/// k and v of one shape, one d, key/value heads dividing the query heads, a head dimension the
/// kernels take, rows the kernels read as they are. Returns the key/value heads.
int64_t check_qkv(const TensorArg& q, const TensorArg& k, const TensorArg& v, size_t rank, const std::string& shape,
                  bool backward) {
    for (const TensorArg* t : {&q, &k, &v}) check_tensor(*t, rank, shape);
    require(q.element == Element::BF16 || q.element == Element::FP16,
            "q is " + to_string(q.element) + ": the kernels take bfloat16 or float16");
    check_same(q, k);
    check_same(q, v);
    require(k.sizes == v.sizes, "k " + shape_text(k.sizes) + " and v " + shape_text(v.sizes) + " must have one shape");
    const size_t d = rank - 1;
    require(k.sizes[d] == q.sizes[d], "k has head dimension " + std::to_string(k.sizes[d]) + " but q has " +
                                          std::to_string(q.sizes[d]) + ": q, k and v share d");
    const int64_t hq = q.sizes[1], hk = k.sizes[1];
    require(hq % hk == 0, "q has " + std::to_string(hq) + " heads and k, v have " + std::to_string(hk) +
                              ": the key/value heads must divide the query heads (grouped-query attention)");
    check_head_dim(q.sizes[d], backward, "q");
    for (const TensorArg* t : {&q, &k, &v}) check_rows(*t);
    return hk;
}

/// Stage 10's options of a dense call; problem.causal sets the window's right bound to 0 (flash-attn's rule).
stage07::ModelOptions model_options(const CallOptions& o, int64_t kv_heads) {
    stage07::ModelOptions m;
    m.kv_heads = kv_heads;
    m.window = Window{o.window_left, o.window_right};
    m.softcap = o.softcap;
    m.dropout = Dropout{o.dropout_p, uint64_t(o.seed), uint32_t(o.offset)};
    return m;
}

}  // namespace

std::string to_string(Element e) {
    switch (e) {
        case Element::BF16: return "bfloat16";
        case Element::FP16: return "float16";
        case Element::FP32: return "float32";
        case Element::INT32: return "int32";
        default: return "another dtype";
    }
}

std::string to_string(Route r) {
    switch (r) {
        case Route::Stage11: return "stage 11";
        case Route::Stage07: return "stage 07";
        case Route::Stage12: return "stage 12";
        case Route::Stage09: return "stage 09";
        case Route::Stage07Varlen: return "stage 07 (packed)";
        default: return "stage 09 (packed)";
    }
}

const std::vector<int>& forward_head_dims() {
    static const std::vector<int> dims{32, 64, 128, 256};
    return dims;
}

const std::vector<int>& backward_head_dims() {
    static const std::vector<int> dims{32, 64, 128};
    return dims;
}

DenseCall check_dense(const TensorArg& q, const TensorArg& k, const TensorArg& v, const CallOptions& options,
                      bool backward) {
    const int64_t hk = check_qkv(q, k, v, 4, "(B, H, N, d)", backward);
    require(k.sizes[0] == q.sizes[0], "k has batch " + std::to_string(k.sizes[0]) + " but q has " + std::to_string(q.sizes[0]));
    const int64_t hq = q.sizes[1];
    check_options(options);
    DenseCall call;
    call.element = q.element;
    call.device = q.device;
    Problem& p = call.problem;
    p.batch = q.sizes[0], p.heads = hq, p.seq_q = q.sizes[2], p.seq_k = k.sizes[2], p.head_dim = q.sizes[3];
    if (options.scale > 0.0 || options.scale < 0.0) p.scale = options.scale;
    p.causal = options.causal;
    call.options = model_options(options, hk);
    p.validate();
    // The stages' own check of the options, whose words are the executables' (--window, --dropout).
    stage07::resolve_options(p, call.options);
    return call;
}

void check_like(const TensorArg& t, const std::vector<int64_t>& sizes, Element element, int device, bool rows_16_bytes) {
    check_tensor(t, sizes.size(), shape_text(sizes));
    require(t.sizes == sizes, t.name + " is " + shape_text(t.sizes) + "; expected " + shape_text(sizes));
    require(t.element == element, t.name + " is " + to_string(t.element) + "; expected " + to_string(element));
    require(t.device == device, t.name + " is on cuda:" + std::to_string(t.device) + "; expected cuda:" +
                                    std::to_string(device) + ", the device of q");
    if (rows_16_bytes) {
        check_rows(t);
    } else {
        int64_t expected = 1;  // the LSE: dense, as the kernels write it
        for (size_t i = sizes.size(); i-- > 0;) {
            require(t.sizes[i] == 1 || t.strides[i] == expected, t.name + " must be contiguous; call .contiguous() on it");
            expected *= t.sizes[i];
        }
    }
}

void check_cu_seqlens(const TensorArg& t, int device) {
    require(t.cuda, t.name + " is not on a CUDA device: give it on the device of q, as flash_attn_varlen_func takes it");
    require(t.element == Element::INT32, t.name + " is " + to_string(t.element) + ": cu_seqlens are int32");
    require(t.sizes.size() == 1 && t.sizes[0] >= 2,
            t.name + " " + shape_text(t.sizes) + " must be one dimension of B + 1 >= 2 entries (0, then each sequence's end)");
    require(t.strides[0] == 1, t.name + " must be contiguous; call .contiguous() on it");
    require(t.device == device, t.name + " is on cuda:" + std::to_string(t.device) + " but q is on cuda:" + std::to_string(device));
}

VarlenCall check_varlen(const TensorArg& q, const TensorArg& k, const TensorArg& v, const TensorArg& cu_seqlens_q,
                        const TensorArg& cu_seqlens_k, const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, const CallOptions& options, bool backward) {
    const int64_t hk = check_qkv(q, k, v, 3, "(total, H, d), a packed batch", backward);
    const int64_t hq = q.sizes[1];
    check_cu_seqlens(cu_seqlens_q, q.device);
    check_cu_seqlens(cu_seqlens_k, q.device);
    require(cu_seqlens_q.sizes[0] == cu_seqlens_k.sizes[0],
            "cu_seqlens_q has " + std::to_string(cu_seqlens_q.sizes[0]) + " entries and cu_seqlens_k " +
                std::to_string(cu_seqlens_k.sizes[0]) + ": both have B + 1");
    require(max_seqlen_q >= 0 && max_seqlen_k >= 0, "max_seqlen_q and max_seqlen_k must be 0 or more");
    check_options(options);
    VarlenCall call;
    call.element = q.element;
    call.device = q.device;
    VarlenProblem& p = call.problem;
    p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;
    p.total_q = q.sizes[0], p.total_k = k.sizes[0], p.heads_q = hq, p.heads_k = hk, p.head_dim = q.sizes[2];
    if (options.scale > 0.0 || options.scale < 0.0) p.scale = options.scale;
    p.window = Window{options.window_left, options.causal ? 0 : options.window_right};
    p.softcap = options.softcap;
    p.dropout = Dropout{options.dropout_p, uint64_t(options.seed), uint32_t(options.offset)};
    call.max = {max_seqlen_q, max_seqlen_k};
    // cu_seqlens from 0, nondecreasing, ending at the totals; every sequence within the longest lengths.
    stage07::resolve_varlen(p, call.max);
    return call;
}

Route forward_route(const DenseCall& call, bool hopper) {
    const bool plain = stage07::resolve_options(call.problem, call.options).plain();
    const bool d_ok = call.problem.head_dim == 64 || call.problem.head_dim == 128;
    return hopper && plain && d_ok ? Route::Stage11 : Route::Stage07;
}

Route backward_route(const DenseCall& call, bool hopper, bool deterministic) {
    const bool plain = stage07::resolve_options(call.problem, call.options).plain();
    return hopper && plain && !deterministic && call.problem.head_dim == 64 ? Route::Stage12 : Route::Stage09;
}

}  // namespace fa::pytorch
