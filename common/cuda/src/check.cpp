#include "fa/cuda/check.hpp"

#include <cstdlib>
#include <cstring>

namespace fa::cuda {

namespace {

std::string where(const char* file, int line) {
    // The file name without its directories keeps the message short and still findable.
    const char* slash = std::strrchr(file, '/');
    return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

std::string describe(cudaError_t status) {
    return std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")";
}

}  // namespace

void check(cudaError_t status, const char* call, const char* file, int line) {
    if (status == cudaSuccess) return;
    throw Error("CUDA call " + std::string(call) + " failed at " + where(file, line) + ": " + describe(status));
}

bool sync_after_launch() {
    static const bool sync = [] {
        const char* v = std::getenv("FA_CUDA_SYNC");
        return v != nullptr && std::strcmp(v, "0") != 0 && *v != '\0';
    }();
    return sync;
}

void check_launch(const std::string& what, const char* file, int line) {
    const cudaError_t launch = cudaGetLastError();
    if (launch != cudaSuccess) {
        throw Error("launch of " + what + " failed at " + where(file, line) + ": " + describe(launch));
    }
    if (sync_after_launch()) {
        const cudaError_t run = cudaDeviceSynchronize();
        if (run != cudaSuccess) {
            throw Error("kernel " + what + " launched at " + where(file, line) + " failed while running: " + describe(run));
        }
    }
}

}  // namespace fa::cuda
