#include "fa/counts.hpp"

#include <cstdio>

namespace fa {

double attention_flops(const Problem& p) {
    const double full = 4.0 * double(p.batch) * double(p.heads) * double(p.seq_q) * double(p.seq_k) * double(p.head_dim);
    return (p.causal && p.seq_q == p.seq_k) ? full / 2.0 : full;
}

double attention_flops_backward(const Problem& p) { return 2.5 * attention_flops(p); }
double attention_flops_fwd_bwd(const Problem& p) { return 3.5 * attention_flops(p); }

double attention_min_bytes(const Problem& p, int bytes_per_element) {
    const double elems = 2.0 * double(p.q_elems()) + 2.0 * double(p.kv_elems());  // q, o, k, v
    return elems * bytes_per_element + 4.0 * double(p.lse_elems());                // lse is float32
}

double score_matrix_bytes(const Problem& p) {
    return 4.0 * double(p.batch) * double(p.heads) * double(p.seq_q) * double(p.seq_k);
}

namespace {

std::string format_with(double value, const char* const* units, int count, double base, const char* suffix) {
    int u = 0;
    while (value >= base && u + 1 < count) {
        value /= base;
        ++u;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s%s" : "%.2f %s%s", value, units[u], suffix);
    return buf;
}

}  // namespace

std::string format_bytes(double bytes) {
    static const char* const units[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi"};
    return format_with(bytes, units, 6, 1024.0, "B");
}

std::string format_flops(double flops) {
    static const char* const units[] = {"", "K", "M", "G", "T", "P", "E"};
    return format_with(flops, units, 7, 1000.0, "FLOP");
}

}  // namespace fa
