# fa_target_sm90a(target)
#
# Builds `target`'s CUDA sources for sm_90a only: the Hopper instructions (wgmma, setmaxnreg) exist
# only in the architecture-specific target "90a", not in plain sm_90. "90a-real" asks CMake (3.25
# names it) for `--generate-code=arch=compute_90a,code=[sm_90a]`: machine code for Hopper, no PTX
# for other GPUs to compile. Every other target keeps CMAKE_CUDA_ARCHITECTURES.
include_guard(GLOBAL)
function(fa_target_sm90a target)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES 90a-real)
endfunction()
