// Stage 02 executable: the safe softmax, checked against stage 01 and the float64 reference.
#include "../01_naive_attention/attention.hpp"
#include "attention.hpp"
#include "fa/stage.hpp"

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "02";
    spec.title = "safe softmax";
    spec.description =
        "S = scale * Q K^T in full; each row's maximum m is subtracted before exp, so exp(s - m) <= 1\n"
        "never overflows: three passes per row (max, sum of exp, normalize). Checked against stage 01\n"
        "(reported as not comparable where it overflows, e.g. --inputs large) and the float64 reference.";
    spec.run = fa::stage02::attention;
    spec.checked_against.push_back({"stage 01 (naive attention)", fa::stage01::attention, {}});
    spec.intermediate_bytes = fa::stage02::intermediate_bytes;
    spec.intermediate_what = "S, overwritten by P, Nq x Nk, one head at a time";
    return fa::run_stage(argc, argv, spec);
}
