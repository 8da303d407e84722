#include "fa/npy.hpp"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "fa/error.hpp"

namespace fa {

float half_to_float(uint16_t bits) {
    const uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    uint32_t out;
    if (exponent == 0) {
        if (mantissa == 0) {
            out = sign << 31;
        } else {  // subnormal half: normalize it
            int e = -1;
            uint32_t m = mantissa;
            do {
                ++e;
                m <<= 1;
            } while ((m & 0x400u) == 0);
            out = (sign << 31) | (uint32_t(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (exponent == 31) {
        out = (sign << 31) | 0x7f800000u | (mantissa << 13);  // inf or NaN
    } else {
        out = (sign << 31) | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    std::memcpy(&f, &out, sizeof f);
    return f;
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw InputError(path + ": " + what);
}

// Returns the text after `'key':` in a header dict, or fails.
std::string header_value(const std::string& path, const std::string& header, const std::string& key) {
    const std::string quoted[] = {"'" + key + "'", "\"" + key + "\""};
    for (const auto& q : quoted) {
        const size_t at = header.find(q);
        if (at == std::string::npos) continue;
        const size_t colon = header.find(':', at + q.size());
        if (colon == std::string::npos) break;
        size_t start = header.find_first_not_of(" ", colon + 1);
        if (start == std::string::npos) break;
        return header.substr(start);
    }
    fail(path, "malformed .npy header: no '" + key + "' entry in " + header);
}

std::vector<int64_t> parse_shape(const std::string& path, const std::string& text) {
    if (text.empty() || text[0] != '(') fail(path, "malformed .npy header: shape is not a tuple");
    const size_t close = text.find(')');
    if (close == std::string::npos) fail(path, "malformed .npy header: shape tuple is not closed");
    std::vector<int64_t> shape;
    std::string inner = text.substr(1, close - 1);
    std::istringstream in(inner);
    std::string item;
    while (std::getline(in, item, ',')) {
        const size_t a = item.find_first_not_of(" \t");
        if (a == std::string::npos) continue;  // trailing comma of a 1-tuple
        const size_t b = item.find_last_not_of(" \tL");
        const std::string digits = item.substr(a, b - a + 1);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 15)
            fail(path, "malformed .npy header: shape entry '" + digits + "' is not a non-negative integer");
        shape.push_back(std::stoll(digits));
    }
    return shape;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, "cannot open file");
    in.seekg(0, std::ios::end);
    const int64_t file_size = static_cast<int64_t>(in.tellg());
    in.seekg(0);
    char magic[8];
    if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
        fail(path, "not a .npy file (bad magic string)");
    const int major = static_cast<unsigned char>(magic[6]);
    uint32_t header_len = 0;
    int64_t prefix = 0;
    if (major == 1) {
        unsigned char len[2];
        if (!in.read(reinterpret_cast<char*>(len), 2)) fail(path, "truncated .npy header");
        header_len = len[0] | (uint32_t(len[1]) << 8);
        prefix = 10;
    } else if (major == 2 || major == 3) {
        unsigned char len[4];
        if (!in.read(reinterpret_cast<char*>(len), 4)) fail(path, "truncated .npy header");
        header_len = len[0] | (uint32_t(len[1]) << 8) | (uint32_t(len[2]) << 16) | (uint32_t(len[3]) << 24);
        prefix = 12;
    } else {
        fail(path, "unsupported .npy format version " + std::to_string(major) + " (1, 2 and 3 are read)");
    }
    if (header_len > (1u << 20) || prefix + int64_t(header_len) > file_size)
        fail(path, "truncated .npy header (header length " + std::to_string(header_len) + ")");
    std::string header(header_len, '\0');
    in.read(header.data(), header_len);

    NpyArray array;
    const std::string descr_text = header_value(path, header, "descr");
    if (descr_text.size() < 2 || (descr_text[0] != '\'' && descr_text[0] != '"'))
        fail(path, "malformed .npy header: descr is not a string");
    const size_t descr_end = descr_text.find(descr_text[0], 1);
    if (descr_end == std::string::npos) fail(path, "malformed .npy header: descr string is not closed");
    array.dtype = descr_text.substr(1, descr_end - 1);
    int element_size = 0;
    if (array.dtype == "<f4" || array.dtype == "=f4") element_size = 4;
    else if (array.dtype == "<f2" || array.dtype == "=f2") element_size = 2;
    else fail(path, "dtype '" + array.dtype + "' is not supported: save float32 ('<f4') or float16 ('<f2')");
    if (header_value(path, header, "fortran_order").rfind("False", 0) != 0)
        fail(path, "Fortran-order arrays are not supported: save with np.ascontiguousarray");
    array.shape = parse_shape(path, header_value(path, header, "shape"));

    int64_t count = 1;
    for (int64_t s : array.shape) {
        if (s != 0 && count > std::numeric_limits<int64_t>::max() / 8 / s) fail(path, "shape is too large");
        count *= s;
    }
    const int64_t data_bytes = count * element_size;
    if (prefix + int64_t(header_len) + data_bytes > file_size) {
        fail(path, "truncated: the shape needs " + std::to_string(data_bytes) + " bytes of data but the file has " +
                       std::to_string(file_size - prefix - int64_t(header_len)));
    }
    array.data.resize(static_cast<size_t>(count));
    if (element_size == 4) {
        in.read(reinterpret_cast<char*>(array.data.data()), data_bytes);
    } else {
        std::vector<uint16_t> half(static_cast<size_t>(count));
        in.read(reinterpret_cast<char*>(half.data()), data_bytes);
        for (size_t i = 0; i < half.size(); ++i) array.data[i] = half_to_float(half[i]);
    }
    if (!in) fail(path, "read error in the data section");
    return array;
}

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
    std::ostringstream dict;
    dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
    for (size_t i = 0; i < shape.size(); ++i) dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    dict << "), }";
    std::string header = dict.str();
    // Pad with spaces so the data starts on a 64-byte boundary, ending the header with '\n'.
    const size_t unpadded = 10 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header.push_back('\n');
    std::ofstream out(path, std::ios::binary);
    if (!out) throw InputError(path + ": cannot create file");
    const unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                      static_cast<unsigned char>(header.size() & 0xff),
                                      static_cast<unsigned char>(header.size() >> 8)};
    out.write(reinterpret_cast<const char*>(prefix), 10);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
    if (!out) throw InputError(path + ": write failed");
}

}  // namespace fa
