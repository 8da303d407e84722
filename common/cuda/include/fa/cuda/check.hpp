/// \file fa/cuda/check.hpp
/// \brief Every CUDA call and every kernel launch is checked; a failure names the call, file and line.
///
/// CUDA reports most failures through return codes that are easy to ignore, and a failed kernel
/// launch says nothing at all until someone asks. `FA_CUDA_CHECK(cudaMalloc(...))` turns a bad
/// return code into a fa::cuda::Error whose message quotes the call as written in the source,
/// with its file and line. `FA_CUDA_CHECK_LAUNCH("kernel name")` does the same for the launch just
/// made. With the environment variable `FA_CUDA_SYNC=1` it also waits for the kernel to finish, so
/// a fault inside the kernel is reported at its launch rather than at a later, unrelated call.
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

/// \namespace fa::cuda
/// \brief What the GPU stages share: checked CUDA calls, device buffers, the GPU's name, clock
/// and memory, CUDA-event timing with the L2 flushed, device copies of a problem's tensors, and
/// the GPU side of the stage driver.
namespace fa::cuda {

/// A CUDA call or a kernel launch failed. The message names the call, the file and the line.
class Error : public std::runtime_error {
public:
    /// \param message what failed, where, and CUDA's own name and description of the error.
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Throws Error when `status` is not cudaSuccess. Use it through FA_CUDA_CHECK.
/// \param status the value the call returned
/// \param call   the call as written in the source
/// \param file   source file of the call
/// \param line   source line of the call
void check(cudaError_t status, const char* call, const char* file, int line);

/// Checks the launch just made: its configuration (cudaGetLastError) and, when the
/// environment sets `FA_CUDA_SYNC=1`, its execution (cudaDeviceSynchronize).
/// Use it through FA_CUDA_CHECK_LAUNCH.
/// \param what names the kernel, e.g. "stage05 attention_kernel<64>"
/// \param file source file of the launch
/// \param line source line of the launch
void check_launch(const std::string& what, const char* file, int line);

/// True when `FA_CUDA_SYNC=1` asks for a synchronizing check after each launch.
bool sync_after_launch();

}  // namespace fa::cuda

/// Runs a CUDA runtime call and throws fa::cuda::Error naming it, its file and line, if it fails.
#define FA_CUDA_CHECK(call) ::fa::cuda::check((call), #call, __FILE__, __LINE__)

/// Checks the kernel launch just made; `what` (a string) names the kernel in the message.
#define FA_CUDA_CHECK_LAUNCH(what) ::fa::cuda::check_launch((what), __FILE__, __LINE__)

namespace fa::cuda {

/// Lets kernel `kKernel` launch with `bytes` of dynamic shared memory. Above 48 KiB a kernel
/// must opt in with cudaFuncSetAttribute; this does it once per process and kernel (the first
/// call's arguments count: a kernel instance always asks for the same). With
/// `max_shared_carveout` it also asks for the largest carveout of the SM's 256 KB for shared
/// memory, so that several blocks that each need much of it fit on one SM (stage 11's small blocks).
template <auto kKernel>
void allow_dynamic_shared_memory(size_t bytes, bool max_shared_carveout = false) {
    static const bool allowed = [bytes, max_shared_carveout] {
        FA_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
        if (max_shared_carveout) {
            FA_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               int(cudaSharedmemCarveoutMaxShared)));
        }
        return true;
    }();
    (void)allowed;
}

}  // namespace fa::cuda
