/// \file bench/ceiling_record.hpp
/// \brief What the ceiling benchmarks (mma_ceiling, wgmma_ceiling, read_ceiling) share on the host:
/// the --json file their records go to.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

namespace fa::bench {

/// Opens `json` on `path` for the benchmark's JSON lines; an empty path leaves it closed (no
/// records). False, with a message on stderr naming the path, when the file cannot be written.
inline bool open_record(std::ofstream& json, const std::string& path) {
    if (path.empty()) return true;
    json.open(path);
    if (!json) {
        std::fprintf(stderr, "error: cannot write %s\n", path.c_str());
        return false;
    }
    return true;
}

}  // namespace fa::bench
