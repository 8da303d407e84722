/// \file road.hpp
/// \brief A stage's road: the steps from the first, simplest kernel to the final one, each a
/// complete kernel that `--step N` runs.
#pragma once

#include <string>
#include <vector>

namespace fa {

/// One step of a road.
struct RoadStep {
    std::string name;  ///< short name, e.g. "float4"
    std::string idea;  ///< one line: what this step changes
};

/// The help text of `--step`: one line per step, its number, name and idea. `default_step`: the
/// step that runs without `--step` (-1: the final one).
inline std::string road_help(const std::vector<RoadStep>& road, int default_step = -1) {
    std::string s = default_step < 0 ? "which step of the road runs (default: the final kernel):"
                                     : "which step of the road runs (default: step " + std::to_string(default_step) + "):";
    for (size_t i = 0; i < road.size(); ++i) s += "\n  " + std::to_string(i) + " " + road[i].name + ": " + road[i].idea;
    return s;
}

}  // namespace fa
