"""torch.ops.flashcourse.*: the extension module loaded, and what PyTorch needs besides its kernels.

The module (_C.so, built from python/csrc/ops.cpp) registers four operators and their CUDA kernels
through PyTorch's stable ABI. This file gives each one a fake kernel (the shapes, dtypes and strides
of its outputs, for torch.compile, torch.export and FakeTensor) and the two forward operators their
autograd formula (the backward operators), so that every operator can be traced, exported and
checked by torch.library.opcheck.

The layout rule the fake kernels share with ops.cpp: an output like a (B, H, N, d) input is dense
in that input's order of the H and N axes, (B, N, H, d) in memory when the token axis is the outer
one (flash-attn's layout: t.stride(2) > t.stride(1)), (B, H, N, d) otherwise.
"""
import os

import torch

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C.so")
if not os.path.isfile(_LIBRARY):
    raise ImportError(f"flashcourse: the extension module {_LIBRARY} is not built; build the package with "
                      "`python3 -m pip install --no-build-isolation ./python` from the repository's root")
torch.ops.load_library(_LIBRARY)

ops = torch.ops.flashcourse


def _like(t: torch.Tensor) -> torch.Tensor:
    """A new tensor shaped as the (B, H, N, d) view t, dense in t's order of the H and N axes."""
    b, h, n, d = t.shape
    if t.stride(2) > t.stride(1):
        return t.new_empty((b, n, h, d)).transpose(1, 2)
    return t.new_empty((b, h, n, d))


@torch.library.register_fake("flashcourse::fwd")
def _fwd_fake(q, k, v, causal, scale, window_left, window_right, softcap, dropout_p, seed, offset):
    return _like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.register_fake("flashcourse::bwd")
def _bwd_fake(dout, q, k, v, out, lse, causal, scale, window_left, window_right, softcap, dropout_p, seed, offset,
              deterministic):
    return _like(q), _like(k), _like(v)


@torch.library.register_fake("flashcourse::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window_left,
                     window_right, softcap, dropout_p, seed, offset):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.register_fake("flashcourse::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                     window_left, window_right, softcap, dropout_p, seed, offset, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _rows_ok(t: torch.Tensor) -> bool:
    """Whether the kernels read t as it is: contiguous features, other strides multiples of 8 elements."""
    return t.stride(-1) == 1 and all(s % 8 == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1)


def _grad_in(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The upstream gradient as the kernels read it: as it comes when they can, else dense like out."""
    if _rows_ok(dout):
        return dout
    return _like(out).copy_(dout) if out.dim() == 4 else dout.contiguous()


# The forward operators' autograd: the saved q, k, v, out and lse feed the backward operator with the
# forward's own options (dropout's seed and offset included: the backward regenerates the same mask).
# lse is an output without a gradient (as flash-attn's): it is marked non-differentiable. dQ's
# contributions are added in a fixed order, bit for bit the same from run to run, when PyTorch is
# asked for deterministic algorithms (torch.use_deterministic_algorithms(True)).

def _fwd_setup_context(ctx, inputs, output):
    q, k, v, causal, scale, window_left, window_right, softcap, dropout_p, seed, offset = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (causal, scale, window_left, window_right, softcap, dropout_p, seed, offset)
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = ops.bwd(_grad_in(dout, out), q, k, v, out, lse, *ctx.options,
                         torch.are_deterministic_algorithms_enabled())
    return (dq, dk, dv) + (None,) * 8


torch.library.register_autograd("flashcourse::fwd", _fwd_backward, setup_context=_fwd_setup_context)


def _varlen_fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window_left, window_right, softcap,
     dropout_p, seed, offset) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = (max_seqlen_q, max_seqlen_k, causal, scale, window_left, window_right, softcap, dropout_p, seed, offset)
    ctx.mark_non_differentiable(lse)


def _varlen_fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = ops.varlen_bwd(_grad_in(dout, out), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options,
                                torch.are_deterministic_algorithms_enabled())
    return (dq, dk, dv) + (None,) * 12


torch.library.register_autograd("flashcourse::varlen_fwd", _varlen_fwd_backward, setup_context=_varlen_fwd_setup_context)
