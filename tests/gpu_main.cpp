// The main() of the GPU test executables: without a usable CUDA GPU they print one line and
// exit with 77, which CTest reports as skipped (SKIP_RETURN_CODE), never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "fa/cuda/device.hpp"

int main(int argc, char** argv) {
    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: these tests need a CUDA GPU (%s)\n", reason.c_str());
        return 77;
    }
    std::printf("GPU: %s\n", fa::cuda::gpu_info().describe().c_str());
    doctest::Context context(argc, argv);
    return context.run();
}
