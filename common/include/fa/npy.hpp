/// \file npy.hpp
/// \brief Reading and writing NumPy .npy files (version 1/2/3, C order, little endian).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fa {

/// An array read from a .npy file, converted to float32.
struct NpyArray {
    std::vector<int64_t> shape;  ///< as stored in the header
    std::string dtype;           ///< the header's descr, e.g. "<f4" or "<f2"
    std::vector<float> data;     ///< C-order elements, converted to float32
};

/// Reads `path`. Accepts float32 (`<f4`) and float16 (`<f2`) arrays in C order. Throws
/// InputError naming the file and the problem for a missing file, a bad magic string, an
/// unsupported dtype or Fortran order, a malformed header, or data shorter than the shape says.
NpyArray read_npy(const std::string& path);

/// Writes a float32 C-order array with `shape` to `path`; throws InputError if it cannot.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);

/// Converts an IEEE 754 half-precision bit pattern to float.
float half_to_float(uint16_t bits);

}  // namespace fa
