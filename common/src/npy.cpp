#include "fa/npy.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <iomanip>
#include <sstream>

#include "fa/error.hpp"

namespace fa {

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what) { throw InputError(name + ": " + what); }

// At most `limit` characters of `text` for a message, anything unprintable shown as '?': a
// corrupted header may hold any bytes, and a message should stay one readable line.
std::string printable(std::string_view text, size_t limit = 80) {
    std::string out;
    for (size_t i = 0; i < text.size() && i < limit; ++i) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        out.push_back(c >= 0x20 && c < 0x7f ? char(c) : '?');
    }
    if (text.size() > limit) out += "...";
    return out;
}

// The preamble: magic string, version, header length. Version 1 stores the length in 2 bytes
// (10 bytes in all), versions 2 and 3 in 4 bytes (12 in all).
struct Preamble {
    int64_t size = 0;        // bytes before the header
    int64_t header_len = 0;  // bytes of header text after it
};

// Largest header read: NumPy writes a few hundred bytes; a length beyond this is a corrupt file.
constexpr int64_t kMaxHeaderBytes = int64_t(1) << 20;
// Largest number of dimensions accepted (NumPy's own limit is 64).
constexpr size_t kMaxDims = 64;

// `start` holds the first min(12, file_size) bytes of a file of `file_size` bytes.
Preamble parse_preamble(std::string_view start, int64_t file_size, const std::string& name) {
    if (start.size() < 8 || start.substr(0, 6) != std::string_view("\x93NUMPY", 6))
        fail(name, "not a .npy file (bad magic string)");
    const int major = static_cast<unsigned char>(start[6]);
    Preamble pre;
    if (major == 1) {
        pre.size = 10;
    } else if (major == 2 || major == 3) {
        pre.size = 12;
    } else {
        fail(name, "unsupported .npy format version " + std::to_string(major) + " (1, 2 and 3 are read)");
    }
    if (int64_t(start.size()) < pre.size) fail(name, "truncated .npy header (the file ends inside its preamble)");
    const auto byte = [&](int64_t i) { return uint32_t(static_cast<unsigned char>(start[size_t(i)])); };
    pre.header_len = major == 1 ? (byte(8) | byte(9) << 8) : (byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24);
    if (pre.header_len > kMaxHeaderBytes)
        fail(name, "corrupt .npy header: it announces " + std::to_string(pre.header_len) + " bytes of header (at most " +
                       std::to_string(kMaxHeaderBytes) + " are read)");
    if (pre.size + pre.header_len > file_size)
        fail(name, "truncated .npy header (header length " + std::to_string(pre.header_len) + ", but only " +
                       std::to_string(file_size - pre.size) + " bytes follow the preamble)");
    return pre;
}

// Returns the text after `'key':` in a header dict, or fails.
std::string_view header_value(const std::string& name, std::string_view header, const std::string& key) {
    const std::string quoted[] = {"'" + key + "'", "\"" + key + "\""};
    for (const auto& q : quoted) {
        const size_t at = header.find(q);
        if (at == std::string_view::npos) continue;
        const size_t colon = header.find(':', at + q.size());
        if (colon == std::string_view::npos) break;
        const size_t start = header.find_first_not_of(' ', colon + 1);
        if (start == std::string_view::npos) break;
        return header.substr(start);
    }
    fail(name, "malformed .npy header: no '" + key + "' entry in " + printable(header));
}

std::vector<int64_t> parse_shape(const std::string& name, std::string_view text) {
    if (text.empty() || text[0] != '(') fail(name, "malformed .npy header: shape is not a tuple");
    const size_t close = text.find(')');
    if (close == std::string_view::npos) fail(name, "malformed .npy header: shape tuple is not closed");
    std::vector<int64_t> shape;
    std::string_view inner = text.substr(1, close - 1);
    while (!inner.empty()) {
        const size_t comma = inner.find(',');
        const std::string_view item = inner.substr(0, comma);
        inner = comma == std::string_view::npos ? std::string_view() : inner.substr(comma + 1);
        const size_t a = item.find_first_not_of(" \t");
        if (a == std::string_view::npos) continue;  // the trailing comma of a 1-tuple
        const size_t b = item.find_last_not_of(" \tL");  // Python 2 wrote longs as 3L
        const std::string_view digits = b == std::string_view::npos || b < a ? std::string_view() : item.substr(a, b - a + 1);
        // 15 digits keep every entry below 1e15, so the parse cannot overflow.
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos || digits.size() > 15)
            fail(name, "malformed .npy header: shape entry '" + printable(item) + "' is not a non-negative integer");
        if (shape.size() == kMaxDims) fail(name, "malformed .npy header: more than " + std::to_string(kMaxDims) + " dimensions");
        int64_t value = 0;
        for (char c : digits) value = value * 10 + (c - '0');
        shape.push_back(value);
    }
    return shape;
}

// What the header says about the data that follows it.
struct NpyHeader {
    std::vector<int64_t> shape;
    std::string dtype;
    int element_size = 0;
    int64_t count = 0;  // elements
};

// Parses the header text; `data_bytes` is how many bytes of the file follow it. A shape whose
// data would not fit in them is refused here, before anything is allocated for it.
NpyHeader parse_header(const std::string& name, std::string_view header, int64_t data_bytes, bool integers = false) {
    NpyHeader h;
    const std::string_view descr_text = header_value(name, header, "descr");
    if (descr_text.size() < 2 || (descr_text[0] != '\'' && descr_text[0] != '"'))
        fail(name, "malformed .npy header: descr is not a string");
    const size_t descr_end = descr_text.find(descr_text[0], 1);
    if (descr_end == std::string_view::npos) fail(name, "malformed .npy header: descr string is not closed");
    h.dtype = std::string(descr_text.substr(1, descr_end - 1));
    if (integers) {
        if (h.dtype == "<i4" || h.dtype == "=i4") h.element_size = 4;
        else if (h.dtype == "<i8" || h.dtype == "=i8") h.element_size = 8;
        else fail(name, "dtype '" + printable(h.dtype) + "' is not supported here: save int32 ('<i4') or int64 ('<i8')");
    } else if (h.dtype == "<f4" || h.dtype == "=f4") h.element_size = 4;
    else if (h.dtype == "<f2" || h.dtype == "=f2") h.element_size = 2;
    else fail(name, "dtype '" + printable(h.dtype) + "' is not supported: save float32 ('<f4') or float16 ('<f2')");
    if (header_value(name, header, "fortran_order").substr(0, 5) != "False")
        fail(name, "Fortran-order arrays are not supported: save with np.ascontiguousarray");
    h.shape = parse_shape(name, header_value(name, header, "shape"));

    // count * element_size <= data_bytes, checked one dimension at a time so that no product
    // can overflow: a header may announce (10^14, 10^14, 10^14) in a 100-byte file.
    bool empty = false;
    for (int64_t s : h.shape) empty = empty || s == 0;
    h.count = empty ? 0 : 1;
    double needed = double(h.element_size);
    for (int64_t s : h.shape) needed *= double(s);
    const auto refuse = [&] {
        std::ostringstream what;
        what << "truncated: the shape needs ";
        if (needed < 1e18) what << int64_t(needed); else what << std::setprecision(3) << needed;
        what << " bytes of data but the file has " << data_bytes;
        fail(name, what.str());
    };
    for (int64_t s : h.shape) {
        if (empty) break;
        if (h.count > data_bytes / h.element_size / s) refuse();
        h.count *= s;
    }
    if (h.count * h.element_size > data_bytes) refuse();  // a 0-d array, shape (), still holds one element
    return h;
}

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

// Converts `h.count` little-endian elements at `data` to float32.
std::vector<float> convert(const NpyHeader& h, const char* data) {
    std::vector<float> out(static_cast<size_t>(h.count));
    if (out.empty()) return out;  // an empty shape, e.g. (0, 3): nothing to copy (and memcpy from nullptr is UB)
    if (h.element_size == 4) {
        std::memcpy(out.data(), data, out.size() * sizeof(float));
    } else {
        for (size_t i = 0; i < out.size(); ++i) {
            uint16_t bits;
            std::memcpy(&bits, data + 2 * i, 2);
            out[i] = half_to_float(bits);
        }
    }
    return out;
}

}  // namespace

NpyArray read_npy_bytes(std::string_view bytes, const std::string& name) {
    const int64_t size = static_cast<int64_t>(bytes.size());
    const Preamble pre = parse_preamble(bytes.substr(0, 12), size, name);
    const int64_t data_offset = pre.size + pre.header_len;
    const NpyHeader h = parse_header(name, bytes.substr(size_t(pre.size), size_t(pre.header_len)), size - data_offset);
    return {h.shape, h.dtype, convert(h, bytes.data() + data_offset)};
}

NpyArray read_npy(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, "cannot open file");
    in.seekg(0, std::ios::end);
    const int64_t file_size = static_cast<int64_t>(in.tellg());
    in.seekg(0);
    if (file_size < 0 || !in) fail(path, "cannot read file");
    std::string start(static_cast<size_t>(std::min<int64_t>(file_size, 12)), '\0');
    in.read(start.data(), static_cast<std::streamsize>(start.size()));
    if (!in) fail(path, "cannot read file");
    const Preamble pre = parse_preamble(start, file_size, path);
    // Only the header is read before the checks; the data is read once its size is known to fit.
    std::string header(static_cast<size_t>(pre.header_len), '\0');
    in.seekg(pre.size);
    in.read(header.data(), static_cast<std::streamsize>(header.size()));
    if (!in) fail(path, "read error in the header");
    const int64_t data_offset = pre.size + pre.header_len;
    const NpyHeader h = parse_header(path, header, file_size - data_offset);
    NpyArray array{h.shape, h.dtype, std::vector<float>(static_cast<size_t>(h.count))};
    if (h.count == 0) return array;
    if (h.element_size == 4) {
        in.read(reinterpret_cast<char*>(array.data.data()), static_cast<std::streamsize>(h.count * 4));
    } else {
        std::vector<uint16_t> half(static_cast<size_t>(h.count));
        in.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(h.count * 2));
        for (size_t i = 0; i < half.size(); ++i) array.data[i] = half_to_float(half[i]);
    }
    if (!in) fail(path, "read error in the data section");
    return array;
}

NpyIntArray read_npy_ints(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, "cannot open file");
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) fail(path, "cannot read file");
    const int64_t size = static_cast<int64_t>(bytes.size());
    const std::string_view view(bytes);
    const Preamble pre = parse_preamble(view.substr(0, 12), size, path);
    const int64_t data_offset = pre.size + pre.header_len;
    const NpyHeader h = parse_header(path, view.substr(size_t(pre.size), size_t(pre.header_len)), size - data_offset, true);
    NpyIntArray array{h.shape, h.dtype, std::vector<int64_t>(static_cast<size_t>(h.count))};
    for (size_t i = 0; i < array.data.size(); ++i) {
        const char* at = bytes.data() + data_offset + int64_t(i) * h.element_size;
        if (h.element_size == 4) {
            int32_t x;
            std::memcpy(&x, at, 4);
            array.data[i] = x;
        } else {
            std::memcpy(&array.data[i], at, 8);
        }
    }
    return array;
}

namespace {

// Writes a C-order array of `bytes` bytes with the header's `descr` ('<f4', '|u1', '<i4').
void write_npy_raw(const std::string& path, const char* descr, const std::vector<int64_t>& shape, const void* data,
                   size_t bytes) {
    std::ostringstream dict;
    dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
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
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) throw InputError(path + ": write failed");
}

}  // namespace

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
    write_npy_raw(path, "<f4", shape, data.data(), data.size() * sizeof(float));
}

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<uint8_t>& data) {
    write_npy_raw(path, "|u1", shape, data.data(), data.size());
}

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<int32_t>& data) {
    write_npy_raw(path, "<i4", shape, data.data(), data.size() * sizeof(int32_t));
}

}  // namespace fa
