// A stand-in for stage 09 (a backward in bf16 or fp16 after a tensor-core forward in the same
// type), so the driver's gradient rule is tested on the CPU: the forward and the backward are the
// arithmetic of stages 07 and 09 written out row by row (tests/variants.hpp), checked like stage
// 09 against stage 08 and the float64 reference. --fault breaks the backward on purpose. Not a
// course stage: only the tests run it.
#include <string>

#include <CLI/CLI.hpp>

#include "../stages/04_cpu_tiling/attention.hpp"
#include "../stages/08_cpu_backward/attention.hpp"
#include "fa/stage.hpp"
#include "variants.hpp"

int main(int argc, char** argv) {
    std::string dtype = "bf16", fault = "none";
    const auto precision = [&] { return dtype == "fp16" ? fa::Precision::Float16 : fa::Precision::BFloat16; };
    fa::StageSpec spec;
    spec.number = "test";
    spec.title = "fake low-precision backward stage";
    spec.description = "Stage 07's forward and stage 09's backward in their arithmetic, in --dtype, on the CPU.";
    spec.run = [&](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                   fa::View4<float> o, fa::View3<float> lse) { fa::test::flash_forward_lowp(p, q, k, v, o, lse, precision()); };
    spec.forward_name = "the stand-in for stage 07 (same --dtype)";
    spec.run_backward = [&](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                            fa::View4<const float> o, fa::View3<const float> lse, fa::View4<const float> dout,
                            fa::View4<float> dq, fa::View4<float> dk, fa::View4<float> dv) {
        const fa::test::BackwardFault f = fault == "drop-tile" ? fa::test::BackwardFault::DropKeyTile
                                          : fault == "flip-ds" ? fa::test::BackwardFault::FlipDsTile
                                                               : fa::test::BackwardFault::None;
        fa::test::flash_backward_lowp(p, q, k, v, o, lse, dout, dq, dk, dv, precision(), f);
    };
    spec.backward_checked_against.push_back(
        {"stage 08 (CPU, after stage 04's forward)", fa::stage08::attention_backward, {}, fa::stage04::attention});
    spec.add_options = [&](CLI::App& app) {
        app.add_option("--dtype", dtype, "bf16 or fp16")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
        app.add_option("--fault", fault, "none, drop-tile (keys 64 to 127 left out) or flip-ds (their dS negated)")
            ->check(CLI::IsMember({"none", "drop-tile", "flip-ds"}))
            ->capture_default_str();
    };
    spec.precision = precision;
    return fa::run_stage(argc, argv, spec);
}
