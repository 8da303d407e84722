/// \file fa/cuda/hopper.hpp
/// \brief Can this GPU run the Hopper stage's instructions (TMA, wgmma, setmaxnreg: sm_90a)?
#pragma once

#include <string>

namespace fa::cuda {

/// "" when the current device is a compute capability 9.0 GPU (Hopper: the sm_90a code of stage
/// 11 runs there); otherwise one line saying what is missing (no GPU, or which GPU it is and
/// what it lacks).
std::string hopper_unavailable_reason();

}  // namespace fa::cuda
