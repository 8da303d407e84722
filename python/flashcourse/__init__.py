"""flashcourse: the kernels of the FlashAttention course as PyTorch operators.

    import torch, flashcourse
    q, k, v = (torch.randn(2, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = flashcourse.flash_attention(q, k, v, causal=True)
    out.sum().backward()

flash_attention() and flash_attention_varlen() (functional.py) check their arguments and call the
operators torch.ops.flashcourse.fwd / bwd / varlen_fwd / varlen_bwd (_ops.py: the extension module,
its fake kernels and autograd). The forward runs stage 11 on a Hopper GPU for the calls it takes and
stage 07 otherwise; the backward stage 12 on Hopper at d = 64 and stage 09 otherwise
(python/csrc/checks.hpp: forward_route(), backward_route()).
"""
from ._ops import ops
from .functional import flash_attention, flash_attention_varlen

__all__ = ["flash_attention", "flash_attention_varlen", "ops"]
