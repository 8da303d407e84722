// A stand-in for a stage that computes in bf16 or fp16 (stage 07 will be the real one), so the
// driver's low-precision rule is tested on the CPU: q, k and v are rounded to --dtype when read,
// the tiled online softmax runs in float32, O is rounded to --dtype when written
// (tests/variants.hpp). --fault breaks it on purpose. Not a course stage: only the tests run it.
#include <string>

#include <CLI/CLI.hpp>

#include "../stages/04_cpu_tiling/attention.hpp"
#include "fa/stage.hpp"
#include "variants.hpp"

int main(int argc, char** argv) {
    std::string dtype = "bf16", fault = "none";
    fa::StageSpec spec;
    spec.number = "test";
    spec.title = "fake low-precision stage";
    spec.description = "q, k, v rounded to --dtype, the tiled online softmax in float32, O rounded to --dtype.";
    spec.run = [&](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                   fa::View4<float> o, fa::View3<float> lse) {
        fa::test::Variant variant;
        variant.precision = dtype == "fp16" ? fa::Precision::Float16 : fa::Precision::BFloat16;
        variant.fault = fault == "skip-rescale"  ? fa::test::Fault::SkipRescale
                        : fault == "drop-tile"   ? fa::test::Fault::DropKeyTile
                        : fault == "repeat-tile" ? fa::test::Fault::RepeatKeyTile
                                                 : fa::test::Fault::None;
        fa::test::flash_variant(p, q, k, v, o, lse, variant);
    };
    spec.checked_against.push_back({"stage 04 (CPU tiling)", fa::stage04::attention, {}});
    spec.add_options = [&](CLI::App& app) {
        app.add_option("--dtype", dtype, "bf16 or fp16")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
        app.add_option("--fault", fault, "none, skip-rescale, drop-tile or repeat-tile")
            ->check(CLI::IsMember({"none", "skip-rescale", "drop-tile", "repeat-tile"}))
            ->capture_default_str();
    };
    spec.precision = [&] { return dtype == "fp16" ? fa::Precision::Float16 : fa::Precision::BFloat16; };
    return fa::run_stage(argc, argv, spec);
}
