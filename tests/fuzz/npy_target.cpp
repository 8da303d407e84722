// The fuzz target of the .npy reader: any bytes in, either an array consistent with its header or
// an InputError that names the file and says what is wrong. Anything else (another exception, a
// crash, a sanitizer report) is a bug. libFuzzer calls it directly (npy_fuzz_libfuzzer); the
// seeded mutation loop (npy_fuzz_loop.cpp) calls it where libFuzzer is not available.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fa/error.hpp"
#include "fa/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string name = "fuzz.npy";
    try {
        const fa::NpyArray a = fa::read_npy_bytes(std::string_view(reinterpret_cast<const char*>(data), size), name);
        // Accepted: a supported dtype, and exactly as many elements as the shape says (the
        // product cannot overflow: the reader checked it against the bytes present).
        if (a.dtype != "<f4" && a.dtype != "=f4" && a.dtype != "<f2" && a.dtype != "=f2") std::abort();
        uint64_t count = 1;
        for (int64_t s : a.shape) {
            if (s < 0) std::abort();
            count *= uint64_t(s);
        }
        if (count != a.data.size()) std::abort();
    } catch (const fa::InputError& e) {
        // Refused: the message names the file and says something after it.
        const std::string_view message = e.what();
        if (message.substr(0, name.size() + 2) != name + ": " || message.size() < name.size() + 10) std::abort();
    }
    return 0;
}
