// The records the executables write for scripts to read (fa/json.hpp): fa::json_text()'s layout and
// figures, and a stage's --json line read back as JSON (docs/make_results.py's keys, with their
// types) for a forward and a backward stage whose title holds a quote and a backslash, which the
// line must escape.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "../stages/04_cpu_tiling/attention.hpp"
#include "../stages/08_cpu_backward/attention.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"
#include "fa/stage.hpp"

namespace {

// A title no JSON string may hold unescaped.
const std::string kAwkwardTitle = R"(a "quoted" title with a back\slash)";

// Sends stdout and stderr to /dev/null while it lives: the stage driver's report is not the
// test's to print.
class Quiet {
public:
    Quiet() {
        std::fflush(stdout), std::fflush(stderr);
        out_ = ::dup(1), err_ = ::dup(2);
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, 1), ::dup2(null, 2);
        ::close(null);
    }
    ~Quiet() {
        std::fflush(stdout), std::fflush(stderr);
        ::dup2(out_, 1), ::dup2(err_, 2);
        ::close(out_), ::close(err_);
    }
    Quiet(const Quiet&) = delete;
    Quiet& operator=(const Quiet&) = delete;

private:
    int out_ = -1, err_ = -1;
};

// The stage's exit code on the command line `args`, its report unprinted.
int run_quietly(const fa::StageSpec& spec, std::vector<std::string> args) {
    args.insert(args.begin(), "stage");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    const Quiet quiet;
    return fa::run_stage(int(argv.size()), argv.data(), spec);
}

// Runs the stage with `args` and --json into a fresh file; returns the exit code and the file's lines.
struct StageRun {
    int exit_code = -1;
    std::vector<std::string> lines;
};

StageRun run_with_json(const fa::StageSpec& spec, std::vector<std::string> args) {
    const std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("fa_test_json_records_" + std::to_string(::getpid()) + ".jsonl");
    std::filesystem::remove(path);
    args.push_back("--json");
    args.push_back(path.string());
    StageRun run;
    run.exit_code = run_quietly(spec, args);
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) run.lines.push_back(line);
    std::filesystem::remove(path);
    return run;
}

// A forward stage, stage 04's kernel under a title no JSON string may hold unescaped.
fa::StageSpec awkward_stage() {
    fa::StageSpec spec;
    spec.number = "99";
    spec.title = kAwkwardTitle;
    spec.run = fa::stage04::attention;
    return spec;
}

// The keys docs/make_results.py reads from every line of cpu_sweep.jsonl, with their JSON types.
void check_run_record(const fa::Json& r) {
    CHECK(r.at("stage") == "99");
    CHECK(r.at("title") == kAwkwardTitle);
    for (const char* key : {"B", "H", "Nq", "Nk", "d", "peak_rss_bytes", "rss_before_bytes"}) {
        CAPTURE(key);
        CHECK(r.at(key).is_number_integer());
    }
    for (const char* key : {"first_ms", "median_ms", "gflops", "intermediate_bytes"}) {
        CAPTURE(key);
        CHECK(r.at(key).is_number());
    }
    CHECK(r.at("causal").is_boolean());
    CHECK(r.at("pass") == true);
    CHECK(r.at("layout") == "bhnd");
    CHECK(r.at("machine").is_string());
    CHECK(r.at("date").get<std::string>().size() == 10);  // YYYY-MM-DD
}

}  // namespace

TEST_CASE("json_text: containers of plain values on one line, the others one member per line") {
    const fa::Json value = {{"name", "x"}, {"flags", {true, false}}, {"rows", {{{"a", 1}, {"b", "two"}}, {{"a", 2}, {"b", nullptr}}}},
                            {"empty", fa::Json::array()}};
    CHECK(fa::json_text(value) ==
          "{\n"
          "  \"name\": \"x\",\n"
          "  \"flags\": [true, false],\n"
          "  \"rows\": [\n"
          "    {\"a\": 1, \"b\": \"two\"},\n"
          "    {\"a\": 2, \"b\": null}\n"
          "  ],\n"
          "  \"empty\": []\n"
          "}");
    CHECK(fa::json_line(value) == R"({"name": "x", "flags": [true, false], "rows": [{"a": 1, "b": "two"}, {"a": 2, "b": null}], "empty": []})");
    CHECK(fa::Json::parse(fa::json_text(value)) == value);
}

TEST_CASE("json_line: figures to six significant digits, whole ones without a fraction, NaN and infinity null, strings escaped") {
    const fa::Json r = {{"ms", 0.12345678901},
                        {"big", 2621440.0},
                        {"tiny", 1.23456789e-7},
                        {"count", int64_t(1) << 40},
                        {"nan", std::numeric_limits<double>::quiet_NaN()},
                        {"inf", std::numeric_limits<double>::infinity()},
                        {"title", kAwkwardTitle + "\n\ttab"},
                        {"bytes", std::string("GPU \xff name")}};
    const std::string line = fa::json_line(r);
    CHECK(line.find('\n') == std::string::npos);
    const fa::Json back = fa::Json::parse(line);
    CHECK(back["ms"].get<double>() == 0.123457);
    CHECK(line.find("\"big\": 2621440,") != std::string::npos);  // a whole number, as %g writes it
    CHECK(back["tiny"].get<double>() == doctest::Approx(1.23457e-7).epsilon(1e-12));
    CHECK(back["count"].is_number_integer());
    CHECK(back["count"] == int64_t(1) << 40);
    CHECK(back["nan"].is_null());
    CHECK(back["inf"].is_null());
    CHECK(back["title"] == kAwkwardTitle + "\n\ttab");
    CHECK(back["bytes"] == "GPU \xef\xbf\xbd name");  // the byte that is not UTF-8 replaced by U+FFFD
}

TEST_CASE("a forward stage's --json line is JSON whose title keeps its quotes and backslash") {
    const StageRun run =
        run_with_json(awkward_stage(), {"--seq-q", "19", "--seq-k", "23", "--heads", "2", "--head-dim", "16", "--causal"});
    CHECK(run.exit_code == fa::kExitPass);
    REQUIRE(run.lines.size() == 1);
    const fa::Json r = fa::Json::parse(run.lines[0]);
    check_run_record(r);
    CHECK(r.at("Nq") == 19);
    CHECK(r.at("Nk") == 23);
    CHECK(r.at("causal") == true);
    CHECK(!r.contains("pass_direction"));
}

TEST_CASE("a backward stage's --json line is JSON too, and says it is the backward's") {
    fa::StageSpec spec = awkward_stage();
    spec.forward_name = "stage 04 (CPU tiling)";
    spec.run_backward = fa::stage08::attention_backward;
    const StageRun run = run_with_json(spec, {"--seq-q", "21", "--seq-k", "21", "--heads", "1", "--head-dim", "16"});
    CHECK(run.exit_code == fa::kExitPass);
    REQUIRE(run.lines.size() == 1);
    const fa::Json r = fa::Json::parse(run.lines[0]);
    check_run_record(r);
    CHECK(r.at("pass_direction") == "backward");
    CHECK(r.at("naive_bytes").is_number());
}

TEST_CASE("--json to a file that cannot be opened is bad input: exit 2") {
    CHECK(run_quietly(awkward_stage(), {"--seq-q", "5", "--seq-k", "5", "--json", "/nonexistent-dir/records.jsonl"}) ==
          fa::kExitBadInput);
}
