// Writes q.npy, k.npy and v.npy for the command-line tests, the way a user saves them from a model:
//
//   make_npy_inputs DIR --shape B,H,Nq,Nk,d [--magnitude M] [--seed S] [--poison T:i,j,...] [--value nan|inf|-inf]
//
// q and k are M times standard normal (entries of magnitude M: M = 30 gives scores in the
// thousands, the "large logits" of real models), v is standard normal. --poison writes the
// --value (default nan) at the given flat indices of tensor T (q, k or v), in C order.
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fa/error.hpp"
#include "fa/inputs.hpp"
#include "fa/npy.hpp"

namespace {

std::vector<int64_t> numbers(const std::string& text) {
    std::vector<int64_t> out;
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s DIR --shape B,H,Nq,Nk,d [--magnitude M] [--seed S] [--poison T:i,j] [--value nan|inf|-inf]\n",
                     argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    std::vector<int64_t> shape;
    double magnitude = 1.0;
    uint64_t seed = 1;
    std::string poison_tensor;
    std::vector<int64_t> poison_at;
    float poison_value = std::numeric_limits<float>::quiet_NaN();
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string opt = argv[i], value = argv[i + 1];
        if (opt == "--shape") shape = numbers(value);
        else if (opt == "--magnitude") magnitude = std::stod(value);
        else if (opt == "--seed") seed = std::stoull(value);
        else if (opt == "--poison") {
            poison_tensor = value.substr(0, value.find(':'));
            poison_at = numbers(value.substr(value.find(':') + 1));
        } else if (opt == "--value") {
            poison_value = value == "inf" ? std::numeric_limits<float>::infinity()
                           : value == "-inf" ? -std::numeric_limits<float>::infinity()
                                             : std::numeric_limits<float>::quiet_NaN();
        } else {
            std::fprintf(stderr, "unknown option %s\n", opt.c_str());
            return 2;
        }
    }
    if (shape.size() != 5) {
        std::fprintf(stderr, "--shape takes B,H,Nq,Nk,d\n");
        return 2;
    }
    fa::Problem p;
    p.batch = shape[0];
    p.heads = shape[1];
    p.seq_q = shape[2];
    p.seq_k = shape[3];
    p.head_dim = shape[4];
    const fa::Inputs in = fa::make_inputs(p, fa::Layout::BHND, fa::InputKind::Normal, seed);
    struct Out {
        const char* name;
        std::vector<float> data;
        std::vector<int64_t> shape;
        float scale;
    } outs[] = {{"q", in.q.logical(), {p.batch, p.heads, p.seq_q, p.head_dim}, float(magnitude)},
                {"k", in.k.logical(), {p.batch, p.heads, p.seq_k, p.head_dim}, float(magnitude)},
                {"v", in.v.logical(), {p.batch, p.heads, p.seq_k, p.head_dim}, 1.0f}};
    try {
        for (Out& o : outs) {
            for (float& x : o.data) x *= o.scale;
            if (poison_tensor == o.name)
                for (int64_t i : poison_at) o.data.at(size_t(i)) = poison_value;
            fa::write_npy(dir + "/" + o.name + ".npy", o.shape, o.data);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
