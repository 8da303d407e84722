#include "fa/unpad.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "fa/error.hpp"

namespace fa {

namespace {

// Fills cu_seqlens and max_seqlen from the per-sequence counts of real tokens.
void finish(PackedIndex& index, const std::vector<int64_t>& counts) {
    index.cu_seqlens.assign(1, 0);
    int64_t total = 0;
    for (int64_t c : counts) {
        total += c;
        if (total > std::numeric_limits<int32_t>::max()) {
            throw InputError("the batch holds more than 2^31 - 1 real tokens: cu_seqlens are int32");
        }
        index.cu_seqlens.push_back(int32_t(total));
        index.max_seqlen = std::max(index.max_seqlen, c);
    }
}

void check_view(const char* name, View4<const float> t, const std::array<int64_t, 4>& want) {
    if (t.shape == want) return;
    std::ostringstream msg;
    msg << name << " has shape (" << t.shape[0] << ", " << t.shape[1] << ", " << t.shape[2] << ", " << t.shape[3]
        << ") but the packing needs (" << want[0] << ", " << want[1] << ", " << want[2] << ", " << want[3] << ")";
    throw InputError(msg.str());
}

// The padded (B, H, N, d) and packed (1, H, total, d) views agree with the index and each other.
void check_views(View4<const float> padded, View4<const float> packed, const PackedIndex& index) {
    const int64_t H = padded.shape[1], d = padded.shape[3];
    check_view("the padded tensor", padded, {index.batch, H, index.seq, d});
    check_view("the packed tensor", packed, {1, H, index.total(), d});
}

}  // namespace

PackedIndex packed_index_from_mask(const std::vector<uint8_t>& mask, int64_t batch, int64_t seq) {
    if (batch < 1 || seq < 0 || int64_t(mask.size()) != batch * seq) {
        std::ostringstream msg;
        msg << "the padding mask holds " << mask.size() << " entries but a (B, N) = (" << batch << ", " << seq
            << ") batch needs B N with B >= 1 and N >= 0";
        throw InputError(msg.str());
    }
    PackedIndex index{batch, seq, {}, {}, 0};
    std::vector<int64_t> counts(size_t(batch), 0);
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t n = 0; n < seq; ++n)
            if (mask[size_t(b * seq + n)]) {
                index.indices.push_back(b * seq + n);
                ++counts[size_t(b)];
            }
    finish(index, counts);
    return index;
}

PackedIndex packed_index_from_lengths(const std::vector<int64_t>& lengths, int64_t seq) {
    if (lengths.empty() || seq < 0) {
        throw InputError("a padded batch needs at least one sequence and a padded length N >= 0");
    }
    PackedIndex index{int64_t(lengths.size()), seq, {}, {}, 0};
    for (size_t b = 0; b < lengths.size(); ++b) {
        if (lengths[b] < 0 || lengths[b] > seq) {
            std::ostringstream msg;
            msg << "sequence " << b << " has length " << lengths[b] << ": lengths must lie in [0, N] with N = " << seq;
            throw InputError(msg.str());
        }
        for (int64_t n = 0; n < lengths[b]; ++n) index.indices.push_back(int64_t(b) * seq + n);
    }
    finish(index, lengths);
    return index;
}

void unpad(View4<const float> padded, const PackedIndex& index, View4<float> packed) {
    check_views(padded, packed, index);
    for (int64_t t = 0; t < index.total(); ++t) {
        const int64_t b = index.indices[size_t(t)] / index.seq, n = index.indices[size_t(t)] % index.seq;
        for (int64_t h = 0; h < padded.shape[1]; ++h)
            for (int64_t x = 0; x < padded.shape[3]; ++x) packed(0, h, t, x) = padded(b, h, n, x);
    }
}

HostTensor unpad(View4<const float> padded, const PackedIndex& index) {
    HostTensor packed(1, padded.shape[1], index.total(), padded.shape[3], Layout::BNHD);
    unpad(padded, index, packed.view);
    return packed;
}

void pad(View4<const float> packed, const PackedIndex& index, View4<float> padded) {
    check_views(padded, packed, index);
    for (int64_t b = 0; b < padded.shape[0]; ++b)  // padding reads as 0, whatever the buffer held
        for (int64_t h = 0; h < padded.shape[1]; ++h)
            for (int64_t n = 0; n < padded.shape[2]; ++n)
                for (int64_t x = 0; x < padded.shape[3]; ++x) padded(b, h, n, x) = 0.0f;
    for (int64_t t = 0; t < index.total(); ++t) {
        const int64_t b = index.indices[size_t(t)] / index.seq, n = index.indices[size_t(t)] % index.seq;
        for (int64_t h = 0; h < padded.shape[1]; ++h)
            for (int64_t x = 0; x < padded.shape[3]; ++x) padded(b, h, n, x) = packed(0, h, t, x);
    }
}

HostTensor pad(View4<const float> packed, const PackedIndex& index, Layout layout) {
    HostTensor padded(index.batch, packed.shape[1], index.seq, packed.shape[3], layout);
    pad(packed, index, padded.view);
    return padded;
}

}  // namespace fa
