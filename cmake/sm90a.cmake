# fa_target_sm90a(target)
#
# Builds `target`'s CUDA sources for sm_90a only: the Hopper instructions (wgmma, setmaxnreg, and
# the TMA forms stage 11 uses) exist only in the architecture-specific target "90a", which
# CMake 3.25's CUDA_ARCHITECTURES cannot name. The target's architecture list is turned off and
# nvcc gets the -gencode option itself; every other target keeps CMAKE_CUDA_ARCHITECTURES.
include_guard(GLOBAL)
function(fa_target_sm90a target)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES OFF)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>)
endfunction()
