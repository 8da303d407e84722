#include "fa/tensor.hpp"

namespace fa {

std::string to_string(Layout layout) { return layout == Layout::BHND ? "bhnd" : "bnhd"; }

std::array<int64_t, 4> dense_strides(int64_t B, int64_t H, int64_t N, int64_t d, Layout layout) {
    (void)B;
    if (layout == Layout::BHND) return {H * N * d, N * d, d, 1};
    // (B, N, H, d) in memory: moving one head skips d elements, one row skips H*d.
    return {N * H * d, d, H * d, 1};
}

HostTensor::HostTensor(int64_t B, int64_t H, int64_t N, int64_t d, Layout layout, float fill)
    : storage(static_cast<size_t>(B * H * N * d), fill),
      view(make_view(storage.data(), B, H, N, d, layout)) {}

HostTensor::HostTensor(const HostTensor& other)
    : storage(other.storage), view{storage.data(), other.view.shape, other.view.stride} {}

HostTensor& HostTensor::operator=(const HostTensor& other) {
    if (this != &other) {
        storage = other.storage;
        view = {storage.data(), other.view.shape, other.view.stride};
    }
    return *this;
}

std::vector<float> HostTensor::logical() const { return to_logical(cview()); }

std::vector<float> to_logical(View4<const float> t) {
    std::vector<float> out;
    out.reserve(static_cast<size_t>(t.numel()));
    for (int64_t b = 0; b < t.shape[0]; ++b)
        for (int64_t h = 0; h < t.shape[1]; ++h)
            for (int64_t n = 0; n < t.shape[2]; ++n)
                for (int64_t x = 0; x < t.shape[3]; ++x) out.push_back(t(b, h, n, x));
    return out;
}

std::vector<float> to_logical(View3<const float> t) {
    std::vector<float> out;
    out.reserve(static_cast<size_t>(t.numel()));
    for (int64_t b = 0; b < t.shape[0]; ++b)
        for (int64_t h = 0; h < t.shape[1]; ++h)
            for (int64_t n = 0; n < t.shape[2]; ++n) out.push_back(t(b, h, n));
    return out;
}

}  // namespace fa
