// A seeded mutation fuzzer for the .npy reader, for machines without libFuzzer (and as a quick,
// reproducible check everywhere). It
//   1. reads every seed file in the corpus directory: ok_* must be read, bad_* refused;
//   2. mutates the seeds the way a damaged or hostile file differs from a good one (flipped bits,
//      truncation, lying header lengths, huge shape entries, spliced files, ...) and runs each
//      result through the fuzz target (npy_target.cpp), which aborts on anything but a
//      consistent array or an InputError with a message;
//   3. every 64th input, also writes it to a file and checks that read_npy (the path, streamed)
//      and read_npy_bytes (in memory) agree: the same array or the same message.
// Under the asan preset this runs with AddressSanitizer and UBSan. A failing input is saved as
// npy_fuzz_failure.npy in the working directory, with the seed and iteration printed.
//
// Usage: npy_fuzz_loop CORPUS_DIR [--seed N] [--iterations N] [--seconds S]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "fa/error.hpp"
#include "fa/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

struct Seed {
    std::string name;
    std::string bytes;
};

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

// What reading gave: the array, or the refusal's message.
struct Outcome {
    bool ok = false;
    std::string message;
    fa::NpyArray array;
    bool operator==(const Outcome& o) const {
        if (ok != o.ok) return false;
        if (!ok) return message == o.message;
        // Bitwise, so that NaN payloads count as equal.
        return array.shape == o.array.shape && array.dtype == o.array.dtype && array.data.size() == o.array.data.size() &&
               (array.data.empty() ||
                std::memcmp(array.data.data(), o.array.data.data(), array.data.size() * sizeof(float)) == 0);
    }
};

template <class Read>
Outcome outcome_of(Read read) {
    Outcome o;
    try {
        o.array = read();
        o.ok = true;
    } catch (const fa::InputError& e) {
        o.message = e.what();
    }
    return o;
}

// One random change of the kind a damaged or hostile .npy file shows.
void mutate(std::string& b, std::mt19937_64& rng, const std::vector<Seed>& seeds) {
    auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
    static const char interesting[] = {'\0', '\x7f', '\x80', '\xff', '(', ')', ',', ' ', '\'', '"', ':',
                                       'L', '0', '1', '9', '{', '}', '\n', '-', 'T', 'F', '<', '>', '='};
    switch (rng() % 11) {
    case 0:  // flip one bit
        if (!b.empty()) b[pick(b.size())] ^= char(1u << (rng() % 8));
        break;
    case 1:  // one byte that means something to the header parser
        if (!b.empty()) b[pick(b.size())] = interesting[pick(sizeof interesting)];
        break;
    case 2:  // truncate
        b.resize(pick(b.size() + 1));
        break;
    case 3: {  // delete a range
        const size_t at = pick(b.size() + 1), n = pick(b.size() - at + 1);
        b.erase(at, n);
        break;
    }
    case 4: {  // duplicate a range
        const size_t at = pick(b.size() + 1), n = pick(std::min<size_t>(64, b.size() - at) + 1);
        b.insert(at, b.substr(at, n));
        break;
    }
    case 5: {  // a header length that lies (bytes 8-9 in version 1, 8-11 in versions 2 and 3)
        if (b.size() < 12) break;
        const uint32_t values[] = {0, 1, 0xffff, 0xffffffffu, uint32_t(1) << 20, uint32_t(rng())};
        const uint32_t v = values[pick(6)];
        for (int i = 0; i < (rng() % 2 ? 2 : 4); ++i) b[size_t(8 + i)] = char((v >> (8 * i)) & 0xff);
        break;
    }
    case 6: {  // a digit run in the header replaced by a longer or shorter one (shape entries)
        const size_t limit = std::min<size_t>(b.size(), 300);
        std::vector<size_t> digits;
        for (size_t i = 10; i < limit; ++i)
            if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
        if (digits.empty()) break;
        const size_t at = digits[pick(digits.size())];
        std::string run(1 + pick(20), '9');
        for (char& c : run) c = char('0' + rng() % 10);
        b.replace(at, 1, run);
        break;
    }
    case 7:  // another version byte
        if (b.size() > 6) b[6] = char(rng() % 5);
        break;
    case 8: {  // the start of one seed with the end of another
        const std::string& other = seeds[pick(seeds.size())].bytes;
        b = b.substr(0, pick(b.size() + 1)) + other.substr(pick(other.size() + 1));
        break;
    }
    case 9: {  // random bytes appended
        const size_t n = 1 + pick(64);
        for (size_t i = 0; i < n; ++i) b.push_back(char(rng()));
        break;
    }
    default: {  // random bytes inserted
        const size_t at = pick(b.size() + 1), n = 1 + pick(8);
        std::string r;
        for (size_t i = 0; i < n; ++i) r.push_back(char(rng()));
        b.insert(at, r);
        break;
    }
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR [--seed N] [--iterations N] [--seconds S]\n", argv[0]);
        return 2;
    }
    uint64_t seed = 20261122;
    long long iterations = 200000;
    double seconds = 20;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string opt = argv[i];
        if (opt == "--seed") seed = std::stoull(argv[i + 1]);
        else if (opt == "--iterations") iterations = std::stoll(argv[i + 1]);
        else if (opt == "--seconds") seconds = std::stod(argv[i + 1]);
        else {
            std::fprintf(stderr, "unknown option %s\n", opt.c_str());
            return 2;
        }
    }

    std::vector<Seed> seeds;
    for (const auto& entry : fs::directory_iterator(argv[1]))
        if (entry.path().extension() == ".npy") seeds.push_back({entry.path().filename().string(), read_file(entry.path())});
    std::sort(seeds.begin(), seeds.end(), [](const Seed& a, const Seed& b) { return a.name < b.name; });
    if (seeds.empty()) {
        std::fprintf(stderr, "no .npy seeds in %s\n", argv[1]);
        return 1;
    }
    std::printf("npy fuzz loop: seed %llu, %zu seed files, up to %lld inputs or %.0f s\n", (unsigned long long)seed,
                seeds.size(), iterations, seconds);

    const fs::path scratch = fs::temp_directory_path() / ("npy_fuzz_loop_" + std::to_string(seed) + "_" + std::to_string(::getpid()));
    fs::create_directories(scratch);
    const fs::path file = scratch / "input.npy";
    int failures = 0;
    // The same bytes read from a file and from memory must give the same outcome.
    auto agree = [&](const std::string& bytes) {
        write_file(file, bytes);
        const Outcome from_file = outcome_of([&] { return fa::read_npy(file.string()); });
        const Outcome from_memory = outcome_of([&] { return fa::read_npy_bytes(bytes, file.string()); });
        return from_file == from_memory;
    };

    // 1. The seeds themselves: ok_* are read, bad_* refused, and both readers agree.
    for (const Seed& s : seeds) {
        const Outcome o = outcome_of([&] { return fa::read_npy_bytes(s.bytes, s.name); });
        const bool want_ok = s.name.rfind("ok_", 0) == 0;
        if (o.ok != want_ok || !agree(s.bytes)) {
            std::printf("FAIL: seed %s was %s%s\n", s.name.c_str(), o.ok ? "read" : ("refused: " + o.message).c_str(),
                        agree(s.bytes) ? "" : " (and the file and memory readers disagree)");
            ++failures;
        }
    }

    // 2. and 3. Mutations.
    std::mt19937_64 rng(seed);
    const auto start = std::chrono::steady_clock::now();
    long long ran = 0, read_ok = 0;
    for (; ran < iterations; ++ran) {
        if ((ran & 1023) == 0 &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
            break;
        std::string bytes = seeds[rng() % seeds.size()].bytes;
        for (int m = 1 + int(rng() % 4); m > 0; --m) mutate(bytes, rng, seeds);
        bool ok = true;
        try {
            LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
            read_ok += outcome_of([&] { return fa::read_npy_bytes(bytes, "x"); }).ok;
        } catch (const std::exception& e) {
            std::printf("FAIL: input %lld escaped with %s\n", ran, e.what());
            ok = false;
        }
        if (ok && (ran % 64) == 0 && !agree(bytes)) {
            std::printf("FAIL: input %lld: the file and memory readers disagree\n", ran);
            ok = false;
        }
        if (!ok) {
            write_file("npy_fuzz_failure.npy", bytes);
            std::printf("      saved as npy_fuzz_failure.npy (seed %llu)\n", (unsigned long long)seed);
            ++failures;
            break;
        }
    }
    fs::remove_all(scratch);
    std::printf("ran %lld mutated inputs: %lld read, %lld refused with a message\n", ran, read_ok, ran - read_ok);
    if (failures) return 1;
    std::printf("no crash, no sanitizer report, every refusal an InputError with a message\n");
    return 0;
}
