// The main() of the GPU test executables: without a usable CUDA GPU (or, built with
// FA_TEST_NEEDS_HOPPER, without a Hopper GPU that runs sm_90a code) they print one line and exit
// with 77, which CTest reports as skipped (SKIP_RETURN_CODE), never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "fa/cuda/device.hpp"
#if defined(FA_TEST_NEEDS_HOPPER)
#include "fa/cuda/hopper.hpp"
#endif

int main(int argc, char** argv) {
#if defined(FA_TEST_NEEDS_HOPPER)
    const std::string reason = fa::cuda::hopper_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: these tests need a Hopper GPU (sm_90a): %s\n", reason.c_str());
        return 77;
    }
#else
    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: these tests need a CUDA GPU (%s)\n", reason.c_str());
        return 77;
    }
#endif
    std::printf("GPU: %s\n", fa::cuda::gpu_info().describe().c_str());
    doctest::Context context(argc, argv);
    return context.run();
}
