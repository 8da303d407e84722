/// \file fa/cuda/buffer.hpp
/// \brief An owning, move-only array in GPU memory.
#pragma once

#include <cstddef>
#include <cstdio>
#include <utility>

#include <cuda_runtime.h>

#include "fa/cuda/check.hpp"

namespace fa::cuda {

/// `count` elements of `T` in device memory, freed when the buffer goes out of scope.
///
/// Allocation and copies are checked (FA_CUDA_CHECK). The destructor cannot throw, so a failure
/// to free is printed instead.
template <class T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    /// Allocates `count` elements (uninitialized).
    explicit DeviceBuffer(size_t count) : count_(count) {
        if (count_ > 0) FA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count_ * sizeof(T)));
    }
    ~DeviceBuffer() { release(); }
    DeviceBuffer(const DeviceBuffer&) = delete;             ///< one owner only
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;  ///< one owner only
    /// Takes the allocation of `other`, which is left empty.
    DeviceBuffer(DeviceBuffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
    /// Frees this buffer, then takes the allocation of `other`.
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
        if (this != &other) {
            release();
            data_ = std::exchange(other.data_, nullptr);
            count_ = std::exchange(other.count_, 0);
        }
        return *this;
    }

    T* data() const { return data_; }          ///< device pointer, not dereferenceable on the host
    size_t size() const { return count_; }     ///< number of elements
    size_t bytes() const { return count_ * sizeof(T); }  ///< size in bytes

    /// Copies `count` elements from host memory into the start of the buffer.
    void copy_from_host(const T* host, size_t count) {
        FA_CUDA_CHECK(cudaMemcpy(data_, host, count * sizeof(T), cudaMemcpyHostToDevice));
    }
    /// Copies `count` elements from the start of the buffer into host memory.
    void copy_to_host(T* host, size_t count) const {
        FA_CUDA_CHECK(cudaMemcpy(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost));
    }

private:
    void release() noexcept {
        if (data_ == nullptr) return;
        const cudaError_t status = cudaFree(data_);
        if (status != cudaSuccess) std::fprintf(stderr, "warning: cudaFree failed: %s\n", cudaGetErrorString(status));
        data_ = nullptr;
        count_ = 0;
    }

    T* data_ = nullptr;
    size_t count_ = 0;
};

}  // namespace fa::cuda
