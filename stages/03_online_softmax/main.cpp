// Stage 03 executable: the online softmax, checked against stage 02 and the float64 reference.
#include "../02_safe_softmax/attention.hpp"
#include "attention.hpp"
#include "fa/stage.hpp"

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "03";
    spec.title = "online softmax";
    spec.description =
        "One query row at a time, one pass over the keys: the running max m, the running sum l and the\n"
        "running output are rescaled by exp(m_old - m_new) whenever the max grows. No Nq x Nk matrix:\n"
        "memory O(N d). Checked against stage 02 and the float64 reference.";
    spec.run = fa::stage03::attention;
    spec.checked_against.push_back({"stage 02 (safe softmax)", fa::stage02::attention, {}});
    spec.intermediate_bytes = fa::stage03::intermediate_bytes;
    spec.intermediate_what = "dense q, k, v of one head and one output row; no score matrix";
    return fa::run_stage(argc, argv, spec);
}
