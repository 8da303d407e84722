#include "fa/cuda/timing.hpp"

#include <algorithm>
#include <vector>

#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"

namespace fa::cuda {

namespace {

// Owns a CUDA event; destroyed with its owner.
class Event {
public:
    Event() { FA_CUDA_CHECK(cudaEventCreate(&event_)); }
    ~Event() { (void)cudaEventDestroy(event_); }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    cudaEvent_t get() const { return event_; }

private:
    cudaEvent_t event_{};
};

}  // namespace

size_t l2_flush_bytes() {
    const size_t l2 = size_t(std::max<int64_t>(gpu_info().l2_bytes, 0));
    return std::max<size_t>(4 * l2, size_t(64) << 20);
}

TimingStats time_on_gpu(const std::function<void(cudaStream_t)>& launch, int warmup, int repeat, cudaStream_t stream) {
    DeviceBuffer<unsigned char> flush(l2_flush_bytes());
    for (int i = 0; i < warmup; ++i) launch(stream);
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));

    std::vector<Event> start(static_cast<size_t>(repeat)), stop(static_cast<size_t>(repeat));
    for (size_t i = 0; i < start.size(); ++i) {
        // Overwriting a buffer four times the L2 evicts the inputs the previous run left there.
        FA_CUDA_CHECK(cudaMemsetAsync(flush.data(), int(i & 0xff), flush.bytes(), stream));
        FA_CUDA_CHECK(cudaEventRecord(start[i].get(), stream));
        launch(stream);
        FA_CUDA_CHECK(cudaEventRecord(stop[i].get(), stream));
    }
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> samples;
    samples.reserve(start.size());
    for (size_t i = 0; i < start.size(); ++i) {
        float ms = 0;
        FA_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i].get(), stop[i].get()));
        samples.push_back(double(ms));
    }
    return summarize(std::move(samples));
}

}  // namespace fa::cuda
