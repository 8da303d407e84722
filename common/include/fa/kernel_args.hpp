/// \file fa/kernel_args.hpp
/// \brief Filling a forward kernel's argument block from the views it reads and writes.
#pragma once

#include "fa/tensor.hpp"

namespace fa {

/// Sets the tensor fields of a forward kernel's argument block `a` as stages 05 to 11 name them:
/// the pointers q, k, v, o, lse, and for each its batch, head and row strides in elements (x_sb,
/// x_sh, x_sn; the feature stride is 1). Stage 05 spells these lines out; the later stages call this.
template <class Args, class In, class Out>
void set_forward_tensors(Args& a, View4<In> q, View4<In> k, View4<In> v, View4<Out> o, View3<float> lse) {
    a.q = q.data, a.k = k.data, a.v = v.data, a.o = o.data, a.lse = lse.data;
    a.q_sb = q.stride[0], a.q_sh = q.stride[1], a.q_sn = q.stride[2];
    a.k_sb = k.stride[0], a.k_sh = k.stride[1], a.k_sn = k.stride[2];
    a.v_sb = v.stride[0], a.v_sh = v.stride[1], a.v_sn = v.stride[2];
    a.o_sb = o.stride[0], a.o_sh = o.stride[1], a.o_sn = o.stride[2];
    a.lse_sb = lse.stride[0], a.lse_sh = lse.stride[1], a.lse_sn = lse.stride[2];
}

}  // namespace fa
