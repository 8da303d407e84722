#include "options.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>

#include <CLI/CLI.hpp>

#include "../07_pipelined_fused_kernel/model_options.hpp"
#include "fa/error.hpp"
#include "fa/lists.hpp"
#include "fa/npy.hpp"

namespace fa::stage10 {

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); ++i) out += std::to_string(s[i]) + (i + 1 < s.size() ? ", " : "");
    return out + ")";
}

std::string dims_text(const std::vector<int>& dims) {
    std::string out;
    for (size_t i = 0; i < dims.size(); ++i) out += (i == 0 ? "" : i + 1 == dims.size() ? " or " : ", ") + std::to_string(dims[i]);
    return out;
}

// A .npy input of 3 dimensions (total, heads, d), as a packed BNHD tensor (1, heads, total, d).
HostTensor load_packed_tensor(const std::string& path, std::vector<int64_t>& shape) {
    const NpyArray a = read_npy(path);
    if (a.shape.size() != 3) {
        throw InputError(path + ": expected 3 dimensions (total, heads, d), the packed layout of flash_attn_varlen_func, got " +
                         std::to_string(a.shape.size()) + " " + shape_text(a.shape));
    }
    if (a.shape[1] < 1 || a.shape[2] < 1) throw InputError(path + ": heads and d must be at least 1, got " + shape_text(a.shape));
    shape = a.shape;
    HostTensor t(1, shape[1], shape[0], shape[2], Layout::BNHD);
    t.storage = a.data;  // BNHD with B = 1 is C order (total, heads, d)
    require_finite(t.cview(), path);
    return t;
}

// cu_seqlens from an int32 or int64 .npy file: 1-D, at least 2 entries, each within int32.
std::vector<int32_t> load_cu_seqlens(const std::string& path) {
    const NpyIntArray a = read_npy_ints(path);
    if (a.shape.size() != 1 || a.shape[0] < 2) {
        throw InputError(path + ": expected 1 dimension of B+1 >= 2 entries (the prefix sums of the lengths), got " +
                         shape_text(a.shape));
    }
    std::vector<int32_t> out;
    for (int64_t x : a.data) {
        if (x < INT32_MIN || x > INT32_MAX) throw InputError(path + ": entry " + std::to_string(x) + " does not fit in int32");
        out.push_back(int32_t(x));
    }
    return out;
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// The problem of the options with the given cu_seqlens (checked by validate()).
VarlenProblem problem_with(const Options& o, const CLI::App& app, std::vector<int32_t> cu_q, std::vector<int32_t> cu_k) {
    VarlenProblem vp;
    vp.cu_seqlens_q = std::move(cu_q), vp.cu_seqlens_k = std::move(cu_k);
    vp.total_q = vp.cu_seqlens_q.back(), vp.total_k = vp.cu_seqlens_k.back();
    vp.heads_q = o.heads, vp.heads_k = o.kv_heads, vp.head_dim = o.head_dim, vp.scale = o.scale;
    if (!o.window.empty()) vp.window = parse_window(o.window);
    if (o.causal) {
        if (!o.window.empty() && vp.window.right != 0) {
            throw InputError("--causal with --window " + o.window + ": causal is the right bound 0, so give --window " +
                             std::to_string(vp.window.left) + ",0 (or leave out --causal)");
        }
        vp.window.right = 0;
    }
    vp.softcap = o.softcap;
    const bool seeded = app.count("--dropout-seed") > 0, offset = app.count("--dropout-offset") > 0;
    if (o.dropout > 0.0 && !seeded) {
        throw InputError("--dropout " + std::to_string(o.dropout) +
                         " needs --dropout-seed S: the mask is fixed by (seed, offset), so that the backward regenerates it");
    }
    if (o.dropout == 0.0 && (seeded || offset)) {
        throw InputError(std::string(seeded ? "--dropout-seed" : "--dropout-offset") +
                         " without --dropout P: give a drop probability P in (0, 1) or leave it out");
    }
    vp.dropout = Dropout{o.dropout, o.dropout_seed, o.dropout_offset};
    vp.validate();
    return vp;
}

}  // namespace

void add_options(CLI::App& app, Options& o) {
    app.add_option("--seqlens", o.seqlens, "queries of each sequence of the packed batch, comma separated (0 allowed)")
        ->capture_default_str();
    app.add_option("--seqlens-k", o.seqlens_k, "keys of each sequence (default: --seqlens), as many entries as --seqlens");
    app.add_option("--heads", o.heads, "Hq: query heads")->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
    app.add_option("--kv-heads", o.kv_heads, "Hk: key/value heads, dividing Hq (Hk = Hq: multi-head, 1: multi-query)")
        ->check(CLI::Range(int64_t{1}, int64_t{4096}))
        ->capture_default_str();
    app.add_option("--head-dim", o.head_dim, "d: features per head (32, 64, 128; 256 with --forward-only)")
        ->check(CLI::Range(int64_t{1}, int64_t{65536}))
        ->capture_default_str();
    app.add_option_function<double>(
           "--scale", [&o](const double& s) { o.scale = s; }, "softmax scale applied to Q K^T (default 1/sqrt(head_dim))")
        ->check(finite_number());
    app.add_option_function<std::string>(
           "--dtype", [&o](const std::string& s) { o.precision = s == "fp16" ? Precision::Float16 : Precision::BFloat16; },
           "16-bit type of q, k, v, o, dO and the gradients: bf16 or fp16")
        ->check(CLI::IsMember({"bf16", "fp16"}))
        ->default_str("bf16");
    app.add_flag("--causal", o.causal, "causal per sequence, bottom-right aligned: the window (-1, 0)");
    app.add_option("--window", o.window,
                   "L,R: query i of a sequence sees keys i + Nk - Nq - L to i + Nk - Nq + R; -1 leaves a side unbounded");
    app.add_option("--softcap", o.softcap, "soft cap C: scores become C tanh(s / C); 0 (default) is off")->check(finite_number());
    app.add_option("--dropout", o.dropout, "probability P of dropping an entry of P (Philox, regenerated in the backward)");
    app.add_option("--dropout-seed", o.dropout_seed, "seed of the dropout mask (needed with --dropout)");
    app.add_option("--dropout-offset", o.dropout_offset, "Philox offset: calls sharing a seed differ by it (default 0)");
    app.add_flag("--deterministic", o.deterministic, "add dQ's contributions in a fixed order (bit-identical dq run to run)");
    app.add_flag("--forward-only", o.forward_only, "run stage 07's forward alone (d = 256 needs it; no gradients)");
    app.add_option("--load", o.load_dir,
                   "read packed q.npy (total_q, Hq, d), k.npy, v.npy (total_k, Hk, d), do.npy and cu_seqlens_q/k.npy (int32, B+1) "
                   "from this directory")
        ->check(CLI::ExistingDirectory);
    app.add_option("--save", o.save_dir,
                   "write q k v do o lse dq dk dv cu_seqlens_q cu_seqlens_k .npy (and dropout_mask.npy) to this directory")
        ->check(CLI::ExistingDirectory);
    add_run_options(app, o.run);
}

std::vector<int64_t> parse_lengths(const std::string& text, const std::string& option) {
    return fa::parse_lengths(text, option, "100,2000,1");
}

Window parse_window(const std::string& text) {
    const std::vector<std::string> items = split_list(text, ',');
    if (items.size() != 2) {
        throw InputError("--window " + text + ": give two bounds L,R (keys left and right of the diagonal; -1 unbounded), e.g. --window 256,0");
    }
    return Window{parse_whole(items[0], "--window", text, -1), parse_whole(items[1], "--window", text, -1)};
}

VarlenProblem make_problem(const Options& o, const CLI::App& app) {
    const std::vector<int64_t> q = parse_lengths(o.seqlens, "--seqlens");
    const std::vector<int64_t> k = o.seqlens_k.empty() ? q : parse_lengths(o.seqlens_k, "--seqlens-k");
    if (k.size() != q.size()) {
        throw InputError("--seqlens-k has " + std::to_string(k.size()) + " entries but --seqlens has " + std::to_string(q.size()) +
                         ": give one key length per sequence");
    }
    return problem_with(o, app, cu_seqlens_from_lengths(q), cu_seqlens_from_lengths(k));
}

PackedInputs load_packed(const Options& o, const CLI::App& app) {
    const std::string dir = o.load_dir;
    std::vector<int64_t> qs, ks, vs;
    PackedInputs p;
    p.in.q = load_packed_tensor(dir + "/q.npy", qs);
    p.in.k = load_packed_tensor(dir + "/k.npy", ks);
    p.in.v = load_packed_tensor(dir + "/v.npy", vs);
    if (ks != vs) throw InputError("k.npy has shape " + shape_text(ks) + " but v.npy has " + shape_text(vs) + ": they must match");
    if (qs[2] != ks[2]) {
        throw InputError("q.npy " + shape_text(qs) + " and k.npy " + shape_text(ks) + " must agree in d (dimension 2)");
    }
    // The files define the shape; an option that disagrees is an error, not a silent override.
    Options o2 = o;
    const std::pair<const char*, int64_t*> given[] = {{"--heads", &o2.heads}, {"--kv-heads", &o2.kv_heads}, {"--head-dim", &o2.head_dim}};
    const int64_t found[] = {qs[1], ks[1], qs[2]};
    for (int i = 0; i < 3; ++i) {
        if (app.count(given[i].first) && *given[i].second != found[i]) {
            throw InputError(std::string(given[i].first) + " " + std::to_string(*given[i].second) + " disagrees with the loaded files (" +
                             std::to_string(found[i]) + "): leave it out when using --load");
        }
        *given[i].second = found[i];
    }
    std::vector<int32_t> cu_q, cu_k;
    const std::string cq = dir + "/cu_seqlens_q.npy", ck = dir + "/cu_seqlens_k.npy";
    if (file_exists(cq) || file_exists(ck)) {
        if (app.count("--seqlens") || app.count("--seqlens-k")) {
            throw InputError("--seqlens with " + dir + "/cu_seqlens_*.npy: the files give the lengths; leave --seqlens out");
        }
        cu_q = load_cu_seqlens(file_exists(cq) ? cq : ck);
        cu_k = load_cu_seqlens(file_exists(ck) ? ck : cq);
        if (cu_q.size() != cu_k.size()) {
            throw InputError("cu_seqlens_q.npy has " + std::to_string(cu_q.size()) + " entries but cu_seqlens_k.npy has " +
                             std::to_string(cu_k.size()) + ": both are B+1");
        }
        o2.seqlens = "", o2.seqlens_k = "";
        p.how = "loaded from " + dir + " (cu_seqlens from the files)";
    } else {
        const std::vector<int64_t> q = parse_lengths(o.seqlens, "--seqlens");
        const std::vector<int64_t> k = o.seqlens_k.empty() ? q : parse_lengths(o.seqlens_k, "--seqlens-k");
        if (k.size() != q.size()) {
            throw InputError("--seqlens-k has " + std::to_string(k.size()) + " entries but --seqlens has " +
                             std::to_string(q.size()) + ": give one key length per sequence");
        }
        cu_q = cu_seqlens_from_lengths(q), cu_k = cu_seqlens_from_lengths(k);
        p.how = "loaded from " + dir + " (lengths from --seqlens, no cu_seqlens_q.npy there)";
    }
    for (const auto& [name, cu, rows, file] : {std::tuple{"queries", &cu_q, qs[0], "q.npy"}, std::tuple{"keys", &cu_k, ks[0], "k.npy"}}) {
        if (cu->back() != rows) {
            throw InputError(std::string("the lengths add up to ") + std::to_string(cu->back()) + " " + name + " but " + file +
                             " has " + std::to_string(rows) + " rows: the packed rows are the sequences back to back");
        }
    }
    p.problem = problem_with(o2, app, cu_q, cu_k);
    const std::string dpath = dir + "/do.npy";
    if (file_exists(dpath)) {
        std::vector<int64_t> ds;
        p.dout = load_packed_tensor(dpath, ds);
        if (ds != qs) throw InputError(dpath + " has shape " + shape_text(ds) + " but q is " + shape_text(qs) + ": they must match");
    }
    return p;
}

PackedInputs make_packed(const Options& o, const CLI::App& app) {
    PackedInputs p;
    p.problem = make_problem(o, app);
    p.in = make_varlen_inputs(p.problem, o.run.inputs, o.run.seed);
    const std::string how = " (--inputs " + to_string(o.run.inputs) + ", seed " + std::to_string(o.run.seed) + ")";
    require_finite(p.in.q.cview(), "generated q" + how);
    require_finite(p.in.k.cview(), "generated k" + how);
    require_finite(p.in.v.cview(), "generated v" + how);
    p.how = to_string(o.run.inputs) + " random, seed " + std::to_string(o.run.seed);
    return p;
}

void check_supported(const VarlenProblem& vp, bool forward_only, const std::vector<int>& forward_dims,
                     const std::vector<int>& backward_dims) {
    const auto has = [](const std::vector<int>& dims, int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
    if (!has(forward_dims, vp.head_dim)) {
        throw InputError("--head-dim " + std::to_string(vp.head_dim) + " is not supported by stage 07's forward: use " +
                         dims_text(forward_dims));
    }
    if (!forward_only && !has(backward_dims, vp.head_dim)) {
        throw InputError("--head-dim " + std::to_string(vp.head_dim) + " is not supported by stage 09's backward (" +
                         dims_text(backward_dims) + "): add --forward-only to run stage 07's forward alone");
    }
    stage07::resolve_varlen(vp, stage07::MaxSeqlens{vp.max_seq_q(), vp.max_seq_k()});
}

//! [count_tiles]
TileCounts count_tiles(const VarlenProblem& vp, int64_t br, int64_t bc) {
    TileCounts t;
    for (int64_t b = 0; b < vp.batch(); ++b) {
        const int64_t nq = vp.seq_q(b), nk = vp.seq_k(b);
        for (int64_t r0 = 0; r0 < nq; r0 += br) {
            for (int64_t c0 = 0; c0 < nk; c0 += bc) {
                const int64_t c1 = std::min(nk, c0 + bc);
                bool any = false, all = c1 - c0 == bc;  // a partial key tile masks its missing keys
                for (int64_t i = r0; i < std::min(nq, r0 + br); ++i) {
                    const KeyRange r = visible_key_range(i, nq, nk, vp.window);
                    any = any || (r.begin < c1 && r.end > c0 && !r.empty());
                    all = all && r.begin <= c0 && r.end >= c1;
                }
                (any ? (all ? t.full : t.masked) : t.skipped) += vp.heads_q;
            }
        }
    }
    return t;
}
//! [count_tiles]

PairCounts count_pairs(const VarlenProblem& vp) {
    PairCounts c;
    c.visible = vp.visible_pairs_per_head();
    for (int64_t b = 0; b < vp.batch(); ++b) c.packed += vp.seq_q(b) * vp.seq_k(b);
    c.padded = vp.batch() * vp.max_seq_q() * vp.max_seq_k();
    return c;
}

}  // namespace fa::stage10
