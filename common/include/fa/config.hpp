/// \file config.hpp
/// \brief Macros shared by host-only and CUDA translation units.
#pragma once

/// Marks a function callable from host code and, when compiled by nvcc, from device code.
#if defined(__CUDACC__)
#define FA_HD __host__ __device__
#else
#define FA_HD
#endif
