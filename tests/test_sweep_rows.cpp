// The committed sweeps held to the code: every row of a stage that has a road names the step it ran,
// and the rows the results page and the lessons show as "stage NN" are that stage's default step now.
// A change of default (a new final step) fails here until the sweep is measured again, or its old
// rows are renamed to the step they ran (impl stageNN_step<i>). No GPU needed: the defaults are host
// functions of the stages' libraries, the sweeps are files of docs/results/.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../stages/05_shared_memory_kernel/attention.cuh"
#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "../stages/09_backward_kernel/attention.cuh"
#include "../stages/11_hopper_kernel/attention.cuh"

namespace {

using Row = std::map<std::string, std::string>;

/// The fields of one CSV line (RFC 4180: fields in double quotes may hold commas and doubled quotes).
std::vector<std::string> split_csv(const std::string& line) {
    std::vector<std::string> out(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
            out.back() += '"';
            ++i;
        } else if (c == '"') {
            quoted = !quoted;
        } else if (c == ',' && !quoted) {
            out.emplace_back();
        } else if (c != '\r') {
            out.back() += c;
        }
    }
    return out;
}

/// Every row of a sweep CSV of docs/results/, by column name.
std::vector<Row> read_sweep(const std::string& name) {
    const std::string path = std::string(FA_RESULTS_DIR) + "/" + name;
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    std::string line;
    std::getline(in, line);
    const std::vector<std::string> header = split_csv(line);
    std::vector<Row> rows;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        const std::vector<std::string> cells = split_csv(line);
        REQUIRE_MESSAGE(cells.size() == header.size(), path << ": a line of " << cells.size() << " fields under a header of "
                                                             << header.size() << ": " << line);
        Row row;
        for (size_t i = 0; i < header.size(); ++i) row[header[i]] = cells[i];
        rows.push_back(row);
    }
    return rows;
}

/// The stages whose sweeps name steps, each with the step it runs by default.
const std::map<std::string, int>& default_steps() {
    static const std::map<std::string, int> steps = {
        {"stage05", fa::stage05::final_step()},
        {"stage07", fa::stage07::final_step()},
        {"stage09", fa::stage09::kDefaultStep},
        {"stage11", fa::stage11::final_step()},
    };
    return steps;
}

/// Checks one sweep: returns how many rows of stages with a road it held.
int check_sweep(const std::string& name) {
    int checked = 0;
    for (const Row& row : read_sweep(name)) {
        const std::string impl = row.at("impl");
        for (const auto& [stage, step] : default_steps()) {
            if (impl.rfind(stage, 0) != 0) continue;
            INFO(name << ": " << impl << ", " << row.at("dtype") << ", N " << row.at("N") << ", d " << row.at("d") << ", "
                      << row.at("date"));
            const std::string rest = impl.substr(stage.size());
            const std::string ran = row.count("step") ? row.at("step") : "";
            CHECK_MESSAGE(!ran.empty(), "the row does not name the step it ran (column step)");
            if (rest.empty() || rest == "_deterministic") {
                // shown as the stage itself: it must be the default step of today's code
                CHECK_MESSAGE(ran == std::to_string(step), "a row shown as " << stage << " ran step " << ran
                                                                              << ", but the default is step " << step);
            } else if (rest.rfind("_step", 0) == 0) {
                // stageNN_step<i>[_deterministic]: the step in its name is the one it ran
                const std::string number = rest.substr(5, rest.find('_', 5) - 5);
                CHECK_MESSAGE(ran == number, "a row named " << impl << " ran step " << ran);
            }
            ++checked;
        }
    }
    return checked;
}

}  // namespace

TEST_CASE("the committed sweeps name the step each row ran, and 'stage NN' rows are the default step") {
    // The forward and backward sweep of stages 05-09, and stage 11's (the H200 grid, the H100 one before it).
    CHECK(check_sweep("gpu_sweep.csv") > 0);
    CHECK(check_sweep("stage11_sweep.csv") > 0);
    CHECK(check_sweep("stage11_sweep_h100.csv") > 0);
}

TEST_CASE("the CSV reader keeps quoted commas and quotes") {
    const std::vector<std::string> cells = split_csv("a,\"b, c\",\"say \"\"hi\"\"\",");
    REQUIRE(cells.size() == 4);
    CHECK(cells[1] == "b, c");
    CHECK(cells[2] == "say \"hi\"");
    CHECK(cells[3].empty());
}
