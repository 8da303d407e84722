/// \file npy.hpp
/// \brief Reading and writing NumPy .npy files (version 1/2/3, C order, little endian).
///
/// The reader takes files from anywhere (a user's `--load` directory), so it trusts nothing in
/// them: every length and shape is checked against the bytes actually present before anything
/// is allocated, and every refusal is an InputError that names the file and what is wrong. A
/// fuzz target (tests/fuzz/) runs it on mutated files under AddressSanitizer and UBSan.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fa/precision.hpp"  // half_to_float(), for float16 files

namespace fa {

/// An array read from a .npy file, converted to float32.
struct NpyArray {
    std::vector<int64_t> shape;  ///< as stored in the header
    std::string dtype;           ///< the header's descr, e.g. "<f4" or "<f2"
    std::vector<float> data;     ///< C-order elements, converted to float32
};

/// An integer array read from a .npy file (cu_seqlens).
struct NpyIntArray {
    std::vector<int64_t> shape;  ///< as stored in the header
    std::string dtype;           ///< "<i4" or "<i8"
    std::vector<int64_t> data;   ///< C-order elements
};

/// Reads an int32 (`<i4`) or int64 (`<i8`) C-order array, with read_npy()'s checks and messages
/// (a float file is refused naming the dtypes allowed). For small index arrays: the whole file
/// is read at once.
NpyIntArray read_npy_ints(const std::string& path);

/// Reads `path`. Accepts float32 (`<f4`) and float16 (`<f2`) arrays in C order. Throws
/// InputError naming the file and the problem for a missing file, a bad magic string, an
/// unsupported version, dtype or Fortran order, a malformed or truncated header, or a shape that
/// needs more data than the file holds (checked before any allocation, so a header announcing
/// an absurd shape costs nothing).
NpyArray read_npy(const std::string& path);

/// Parses a whole .npy file held in memory, with the same checks and messages as read_npy();
/// `name` stands for the file in the messages.
NpyArray read_npy_bytes(std::string_view bytes, const std::string& name);

/// Writes a float32 C-order array with `shape` to `path`; throws InputError if it cannot.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);

/// Writes a uint8 (`|u1`) C-order array, such as a dropout keep mask; throws InputError if it cannot.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<uint8_t>& data);

/// Writes an int32 (`<i4`) C-order array, such as `cu_seqlens`; throws InputError if it cannot.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<int32_t>& data);

}  // namespace fa
