// bench_gpu's stage 10 rows: stage 07's forward (and, with stage 09, its backward) with stage 10's
// switches at each dense point (--model07) beside the plain causal kernels, and on a packed batch
// of mixed lengths (--varlen07) beside a uniform one, packed and dense (bench_gpu.hpp).
#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "../../stages/07_pipelined_fused_kernel/attention.cuh"
#include "bench_gpu.hpp"
#include "fa/counts.hpp"
#include "fa/error.hpp"

namespace bench {

std::string Model07::variant() const {
    const auto bound = [](int64_t b) { return b < 0 ? std::string("all") : std::to_string(b); };
    const auto number = [](double x) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", x);
        return std::string(buf);
    };
    std::string out;
    const auto add = [&](const std::string& part) { out += (out.empty() ? "" : "_") + part; };
    if (group > 1) add("gqa" + std::to_string(group));
    if (window.left >= 0 || window.right != 0) {
        add("window" + bound(window.left) + (window.right != 0 ? "r" + bound(window.right) : ""));
    }
    if (softcap > 0) add("softcap" + number(softcap));
    if (dropout > 0) add("dropout" + number(dropout));
    return out.empty() ? "causal" : out;
}

Model07 parse_model07(const std::string& spec) {
    std::vector<double> x;
    size_t start = 0;
    while (start <= spec.size()) {
        const size_t slash = spec.find('/', start);
        const std::string part = spec.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        try {
            size_t used = 0;
            x.push_back(std::stod(part, &used));
            if (used != part.size()) throw std::invalid_argument(part);
        } catch (const std::exception&) {
            throw fa::InputError("--model07 " + spec + ": expected GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]], numbers");
        }
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    if (x.size() < 3 || x.size() > 5 || x[0] < 1) {
        throw fa::InputError("--model07 " + spec + ": expected GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]] with GROUP >= 1");
    }
    return {spec, int64_t(x[0]), fa::Window{int64_t(x[1]), int64_t(x[2])}, x.size() >= 4 ? x[3] : 0.0, x.size() == 5 ? x[4] : 0.0};
}

namespace {

// FLOPs of `pairs` visible (query, key) pairs, summed over heads and batch entries, at head
// dimension d in one pass: 4 d per pair forward (two products of 2 d), times the ratio of
// fa::attention_flops_backward (fa::attention_flops_fwd_bwd) to fa::attention_flops for the
// backward (the pair). Masked pairs, windows' and padding's, are not counted.
double visible_flops(double pairs, int64_t d, const std::string& pass) {
    const fa::Problem any;  // the ratios do not depend on the shape
    const double per_forward = pass == "backward"  ? fa::attention_flops_backward(any) / fa::attention_flops(any)
                               : pass == "fwd+bwd" ? fa::attention_flops_fwd_bwd(any) / fa::attention_flops(any)
                                                   : 1.0;
    return 4.0 * double(d) * pairs * per_forward;
}

// A stage 10 row: `proto` (what the row is: impl, dtype, its problem, whose causal flag says
// whether the window's right bound is 0, its spec, note and heads) in one pass, in TFLOP/s of
// `pairs` visible pairs (visible_flops); `t` null: the entry point refused the point, and
// `refusal` says why (the times are then -1, written as empty fields and null).
Record stage10_record(const Record& proto, const std::string& pass, double pairs, const fa::TimingStats* t,
                      const std::string& refusal) {
    Record r = proto;
    r.pass = pass;
    if (t == nullptr) {
        r.note = refusal;
        r.median_ms = r.min_ms = r.max_ms = r.tflops = -1;
        return r;
    }
    r.median_ms = t->median_ms, r.min_ms = t->min_ms, r.max_ms = t->max_ms;
    r.tflops = visible_flops(pairs, r.problem.head_dim, pass) / (t->median_ms * 1e-3) * 1e-12;
    r.sm_clock_mhz = fa::cuda::current_sm_clock_mhz();
    return r;
}

// One stage 10 point in every pass it has: the forward alone and, with a `backward` (not empty),
// the backward alone after one forward and the two timed as one pair (the L2 flushed before the
// pair, not between its halves). Each runs once untimed first (a stage 09 workspace grows there).
// An entry point that refuses the point (fa::InputError: dropout in a backward that does not
// apply it yet, a head dimension without a kernel) gives rows without times whose note is
// "refused: " and its message; the other passes go on. The forward's row comes first.
std::vector<Record> time_stage10(const Record& proto, double pairs, const std::function<void(cudaStream_t)>& forward,
                                 const std::function<void(cudaStream_t)>& backward, const Sweep& sweep) {
    std::vector<Record> rows;
    const auto refused = [&](std::initializer_list<const char*> passes, const fa::InputError& e) {
        for (const char* pass : passes) rows.push_back(stage10_record(proto, pass, pairs, nullptr, std::string("refused: ") + e.what()));
    };
    try {
        forward(nullptr);
    } catch (const fa::InputError& e) {
        backward ? refused({"forward", "backward", "fwd+bwd"}, e) : refused({"forward"}, e);
        return rows;
    }
    const fa::TimingStats f = sweep.time(forward);
    rows.push_back(stage10_record(proto, "forward", pairs, &f, ""));
    if (!backward) return rows;
    try {
        backward(nullptr);
    } catch (const fa::InputError& e) {
        refused({"backward", "fwd+bwd"}, e);
        return rows;
    }
    const fa::TimingStats b = sweep.time(backward);
    const fa::TimingStats fb = sweep.time([&](cudaStream_t s) {
        forward(s);
        backward(s);
    });
    rows.push_back(stage10_record(proto, "backward", pairs, &b, ""));
    rows.push_back(stage10_record(proto, "fwd+bwd", pairs, &fb, ""));
    return rows;
}

// The prototype of a stage 10 row: what it is before any pass is timed.
Record row10(const std::string& impl, const std::string& dtype, const fa::Problem& p, int64_t kv_heads,
             const std::string& spec, const std::string& note) {
    Record r;
    r.impl = impl, r.dtype = dtype, r.problem = p, r.kv_heads = kv_heads, r.spec = spec, r.note = note;
    return r;
}

// One line per stage 10 row, with its time over the plain causal kernel's where it has one.
void print_stage10(const Record& r) {
    const fa::Problem& p = r.problem;
    std::printf("stage10 %-20s %s %-7s d=%-3lld N=%-5lld B=%-2lld Hq=%-2lld ", r.impl.substr(8).c_str(), r.dtype.c_str(),
                r.pass.c_str(), (long long)p.head_dim, (long long)p.seq_q, (long long)p.batch, (long long)p.heads);
    if (r.median_ms < 0) {
        std::printf("%s\n", r.note.c_str());
    } else {
        std::printf("%9.3f ms %6.1f TFLOP/s (visible pairs)", r.median_ms, r.tflops);
        if (r.time_over_causal >= 0) std::printf("; %.3f times the plain causal kernel's", r.time_over_causal);
        std::printf("%s%s\n", r.note.empty() ? "" : "; ", r.note.c_str());
    }
    std::fflush(stdout);
}

// Stage 10's switches at one dense point (--model07), rows "stage10_<variant>" (Model07::variant()):
// stage 07's final kernel with each point's ModelOptions, and with `g` (stage 09 among --stages)
// stage 09's backward with the same options, beside the plain causal kernels of both on the same q
// (B, H, N, d) (rows "stage10_causal"). k and v (and dk, dv) are read as their first H / group
// heads, in place. TFLOP/s of the visible (query, key) pairs only; `lse`: the forward's when there
// is no backward (with one, g->lse).
template <class T>
void stage10_points(Sweep& sweep, const fa::Problem& dense, const std::string& dtype, fa::cuda::HalfTensors<T>& half,
                    fa::View3<float> lse, HalfBackward<T>* g, fa::stage09::Workspace* workspace) {
    fa::Problem causal = dense, windowed = dense;
    causal.causal = true;
    windowed.causal = false;  // the window says which keys each query sees
    const fa::View3<float> out_lse = g != nullptr ? g->lse : lse;
    const auto pairs_of = [&](fa::Window w) {
        int64_t pairs = 0;
        for (int64_t i = 0; i < dense.seq_q; ++i) pairs += fa::visible_key_range(i, dense.seq_q, dense.seq_k, w).size();
        return double(pairs) * double(dense.batch * dense.heads);
    };
    std::function<void(cudaStream_t)> plain_backward;
    if (g != nullptr) {
        plain_backward = [&](cudaStream_t s) {
            fa::stage09::attention_backward_device(causal, half.q, half.k, half.v, fa::View4<const T>(half.o),
                                                   fa::View3<const float>(g->lse), g->dout, g->dq, g->dk, g->dv, false, s, workspace);
        };
    }
    const std::vector<Record> base = time_stage10(
        row10("stage10_causal", dtype, causal, dense.heads, "", ""), pairs_of(fa::Window::causal()),
        [&](cudaStream_t s) { fa::stage07::attention_device(causal, half.q, half.k, half.v, half.o, out_lse, s); }, plain_backward,
        sweep);
    for (const Record& r : base) print_stage10(r);
    sweep.records.insert(sweep.records.end(), base.begin(), base.end());
    for (const Model07& m : sweep.s.model07) {
        if (m.variant() == "causal") continue;  // the plain causal kernels, timed above
        fa::stage07::ModelOptions options;
        options.kv_heads = std::max<int64_t>(1, dense.heads / m.group), options.window = m.window, options.softcap = m.softcap;
        options.dropout = fa::Dropout{m.dropout, 2024, 0};  // p = 0: no dropout (the seed is then unused)
        fa::View4<const T> k = half.k, v = half.v;
        k.shape[1] = v.shape[1] = options.kv_heads;
        std::function<void(cudaStream_t)> backward;
        if (g != nullptr) {
            backward = [&, k, v](cudaStream_t s) {
                fa::View4<T> dk = g->dk, dv = g->dv;
                dk.shape[1] = dv.shape[1] = options.kv_heads;
                fa::stage09::attention_backward_device(windowed, options, half.q, k, v, fa::View4<const T>(half.o),
                                                       fa::View3<const float>(g->lse), g->dout, g->dq, dk, dv, false, s, workspace);
            };
        }
        fa::Problem shown = dense;  // the rows' problem: causal when no key after the diagonal is seen
        shown.causal = m.window.right == 0;
        std::vector<Record> rows = time_stage10(
            row10("stage10_" + m.variant(), dtype, shown, options.kv_heads, m.spec, "Hk " + std::to_string(options.kv_heads)),
            pairs_of(m.window),
            [&](cudaStream_t s) { fa::stage07::attention_device(windowed, options, half.q, k, v, half.o, out_lse, s); }, backward,
            sweep);
        for (Record& r : rows) {
            const auto b = std::find_if(base.begin(), base.end(), [&](const Record& x) { return x.pass == r.pass; });
            if (r.median_ms >= 0 && b != base.end() && b->median_ms > 0) r.time_over_causal = r.median_ms / b->median_ms;
            print_stage10(r);
        }
        sweep.records.insert(sweep.records.end(), rows.begin(), rows.end());
    }
}

// --varlen07: a packed batch of sequences of the given lengths (causal, each sequence aligned
// bottom-right, Hq = Hk = H) through stage 07's attention_varlen_device (rows "stage10_varlen"),
// beside the same kernel on a packed batch of B equal lengths (the same tokens, up to B - 1
// dropped: "stage10_varlen_uniform") and the dense causal kernel on that uniform batch
// ("stage10_dense_uniform"); with `backward`, stage 09's attention_backward_varlen_device and its
// dense call after each. Every row's problem is B sequences of H heads with N the mixed batch's
// tokens (its note gives the uniform batch's shape); TFLOP/s of the visible (query, key) pairs
// only. The packed calls' times include what the call does on the host (checking cu_seqlens,
// building and copying the schedule).
template <class T>
void stage10_varlen(Sweep& sweep, int64_t heads, int64_t d, const std::string& dtype, bool backward) {
    const auto packed_problem = [&](const std::vector<int64_t>& lens) {
        fa::VarlenProblem vp;
        vp.cu_seqlens_q = vp.cu_seqlens_k = fa::cu_seqlens_from_lengths(lens);
        vp.total_q = vp.total_k = vp.cu_seqlens_q.back();
        vp.heads_q = vp.heads_k = heads, vp.head_dim = d, vp.window = fa::Window::causal();
        return vp;
    };
    const fa::VarlenProblem mixed = packed_problem(sweep.s.varlen07);
    const int64_t total = mixed.total_q, batch = mixed.batch(), n = std::max<int64_t>(1, total / batch);
    const fa::VarlenProblem uniform = packed_problem(std::vector<int64_t>(size_t(batch), n));
    const int64_t rows = std::max(total, uniform.total_q);
    // q, k, v and dO: normal, standard deviation 1, drawn on the device (seeds 1, 2, 3 and dO's),
    // packed (rows, H, d) in T. The gradients and the workspace only with a backward.
    const auto draw = [&](uint64_t seed) {
        fa::cuda::DeviceBuffer<float> f(size_t(rows * heads * d));
        fa::cuda::fill_normal(f.data(), rows * heads * d, seed, 1.0f);
        fa::cuda::DeviceBuffer<T> h(size_t(rows * heads * d));
        fa::cuda::convert(fa::make_packed_view(static_cast<const float*>(f.data()), rows, heads, d),
                          fa::make_packed_view(h.data(), rows, heads, d));
        FA_CUDA_CHECK(cudaDeviceSynchronize());  // the rounding has read f before it is freed
        return h;
    };
    const fa::cuda::DeviceBuffer<T> q = draw(1), k = draw(2), v = draw(3);
    const fa::cuda::DeviceBuffer<T> dout = backward ? draw(kDoutSeed) : fa::cuda::DeviceBuffer<T>(0);
    const size_t grad_elems = backward ? size_t(rows * heads * d) : 0;
    fa::cuda::DeviceBuffer<T> o(size_t(rows * heads * d)), dq(grad_elems), dk(grad_elems), dv(grad_elems);
    fa::cuda::DeviceBuffer<float> lse(size_t(rows * heads));
    fa::stage09::Workspace workspace;
    fa::Problem shown;  // what the rows say: B sequences, H heads, N tokens in all
    shown.batch = batch, shown.heads = heads, shown.seq_q = shown.seq_k = total, shown.head_dim = d, shown.causal = true;
    const auto time_packed = [&](const fa::VarlenProblem& vp, const Record& proto) {
        fa::cuda::DeviceBuffer<int32_t> cu(vp.cu_seqlens_q.size());
        cu.copy_from_host(vp.cu_seqlens_q.data(), vp.cu_seqlens_q.size());
        fa::cuda::DeviceBuffer<int32_t> schedule(size_t(fa::stage07::varlen_schedule_ints(vp)));
        fa::cuda::DeviceBuffer<int32_t> schedule09(backward ? size_t(fa::stage09::varlen_backward_schedule_ints(vp)) : 0);
        const auto in_view = [&](const fa::cuda::DeviceBuffer<T>& x) {
            return fa::make_packed_view(static_cast<const T*>(x.data()), vp.total_q, heads, d);
        };
        const auto out_view = [&](fa::cuda::DeviceBuffer<T>& x) { return fa::make_packed_view(x.data(), vp.total_q, heads, d); };
        const fa::View3<float> lv{lse.data(), {1, heads, vp.total_q}, {heads * vp.total_q, vp.total_q, 1}};
        const fa::stage07::MaxSeqlens max{vp.max_seq_q(), vp.max_seq_k()};
        std::function<void(cudaStream_t)> bwd;
        if (backward) {
            bwd = [&](cudaStream_t s) {
                fa::stage09::attention_backward_varlen_device(vp, max, in_view(q), in_view(k), in_view(v), in_view(o),
                                                              fa::View3<const float>(lv), in_view(dout), out_view(dq),
                                                              out_view(dk), out_view(dv),
                                                              fa::stage09::VarlenBackwardArrays{cu.data(), cu.data(), schedule09.data()},
                                                              false, s, &workspace);
            };
        }
        return time_stage10(
            proto, double(vp.visible_pairs_per_head()) * double(heads),
            [&](cudaStream_t s) {
                fa::stage07::attention_varlen_device(vp, max, in_view(q), in_view(k), in_view(v), out_view(o), lv,
                                                     fa::stage07::VarlenDeviceArrays{cu.data(), cu.data(), schedule.data()}, s);
            },
            bwd, sweep);
    };
    const std::string uniform_note = std::to_string(batch) + " x " + std::to_string(n) + " tokens";
    Record mixed_row = row10("stage10_varlen", dtype, shown, heads, "", "longest " + std::to_string(mixed.max_seq_q()));
    mixed_row.longest = mixed.max_seq_q();
    Record uniform_row = row10("stage10_varlen_uniform", dtype, shown, heads, "", uniform_note + ", packed");
    uniform_row.uniform_length = n;
    Record dense_row = row10("stage10_dense_uniform", dtype, shown, heads, "", uniform_note + ", dense");
    dense_row.uniform_length = n;
    std::vector<std::vector<Record>> all;
    all.push_back(time_packed(mixed, mixed_row));
    all.push_back(time_packed(uniform, uniform_row));
    // The uniform packed rows read as (B, H, N, d) by the dense kernels.
    fa::Problem p;
    p.batch = batch, p.heads = heads, p.seq_q = p.seq_k = n, p.head_dim = d, p.causal = true;
    const auto dense = [&](const fa::cuda::DeviceBuffer<T>& x) {
        return fa::View4<const T>{x.data(), {batch, heads, n, d}, {n * heads * d, d, heads * d, 1}};
    };
    const auto dense_out = [&](fa::cuda::DeviceBuffer<T>& x) {
        return fa::View4<T>{x.data(), {batch, heads, n, d}, {n * heads * d, d, heads * d, 1}};
    };
    const fa::View3<float> ld{lse.data(), {batch, heads, n}, {heads * n, n, 1}};
    std::function<void(cudaStream_t)> dense_bwd;
    if (backward) {
        dense_bwd = [&](cudaStream_t s) {
            fa::stage09::attention_backward_device(p, dense(q), dense(k), dense(v), dense(o), fa::View3<const float>(ld), dense(dout),
                                                   dense_out(dq), dense_out(dk), dense_out(dv), false, s, &workspace);
        };
    }
    all.push_back(time_stage10(
        dense_row, double(uniform.visible_pairs_per_head()) * double(heads),
        [&](cudaStream_t s) { fa::stage07::attention_device(p, dense(q), dense(k), dense(v), dense_out(o), ld, s); }, dense_bwd,
        sweep));
    // Each packed row against the dense kernel's on the uniform batch in the same pass, by rate
    // (the batches' visible pairs differ).
    for (std::vector<Record>& rows_of : all) {
        for (Record& r : rows_of) {
            const Record* base = nullptr;
            for (const Record& b : all.back()) base = b.pass == r.pass && b.median_ms > 0 ? &b : base;
            if (base != nullptr && r.median_ms > 0 && &rows_of != &all.back()) r.rate_over_dense_uniform = r.tflops / base->tflops;
            print_stage10(r);
            if (r.rate_over_dense_uniform >= 0) {
                std::printf("          rate over the dense kernel's on the uniform batch: %.3f\n", r.rate_over_dense_uniform);
            }
            sweep.records.push_back(r);
        }
    }
}

}  // namespace

void time_stage10_points(Sweep& sweep, ShapeTensors& shape) {
    const Settings& s = sweep.s;
    // Once per shape (the window carries the causal mask: (-1, 0) is causal), at the last causal value.
    if (!(s.has07 || s.has09) || s.model07.empty() || shape.p.causal != s.causal_values.back()) return;
    for (const std::string& t : s.dtypes) {
        if (t == "bf16") {
            stage10_points(sweep, shape.p, t, *shape.half.bf16, shape.dev.lse, s.has09 ? &*shape.grads.bf16 : nullptr,
                           &shape.workspace09);
        } else {
            stage10_points(sweep, shape.p, t, *shape.half.fp16, shape.dev.lse, s.has09 ? &*shape.grads.fp16 : nullptr,
                           &shape.workspace09);
        }
    }
}

void time_stage10_varlen(Sweep& sweep) {
    const Settings& s = sweep.s;
    if (!(s.has07 || s.has09) || s.varlen07.empty()) return;
    for (int64_t d : s.head_dims) {
        for (const std::string& t : s.dtypes) {
            const int64_t heads = std::max<int64_t>(1, s.width / d);
            if (t == "bf16") {
                stage10_varlen<__nv_bfloat16>(sweep, heads, d, t, s.has09);
            } else {
                stage10_varlen<__half>(sweep, heads, d, t, s.has09);
            }
        }
    }
}

}  // namespace bench
