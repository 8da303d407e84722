// Stage 01 executable: naive attention checked against the float64 reference.
#include "attention.hpp"
#include "fa/stage.hpp"

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "01";
    spec.title = "naive attention";
    spec.description =
        "S = scale * Q K^T in full, P = exp(S) / rowsum(exp(S)), O = P V. Checked against the float64 reference.\n"
        "Try --inputs large: the textbook softmax overflows, which is what stage 02 fixes.";
    spec.run = fa::stage01::attention;
    spec.intermediate_bytes = fa::stage01::intermediate_bytes;
    spec.intermediate_what = "S and P, Nq x Nk each, one head at a time";
    spec.naive_softmax = true;
    return fa::run_stage(argc, argv, spec);
}
