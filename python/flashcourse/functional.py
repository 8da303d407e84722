"""The course's attention for PyTorch users, with the conventions of
torch.nn.functional.scaled_dot_product_attention and flash_attn_func.

    out = flash_attention(q, k, v, causal=True)                        # q, k, v (B, H, N, d), as SDPA takes them
    out = flash_attention(q, k, v, causal=True, layout="bnhd")         # (B, N, H, d), as flash_attn_func takes them
    out = flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)    # packed (total, H, d), as flash_attn_varlen_func

Grouped-query heads come from the shapes (k and v with fewer heads than q, dividing them); causal is
bottom-right aligned (flash-attn >= 2.1: query i sees key j iff j <= i + Nk - Nq), and a query row
that sees no key gets 0 and zero gradients. bf16 and fp16 on a CUDA GPU; head dimension 32, 64 or 128
(256 without gradients). Anything else is refused with an error naming the argument, never run some
other way.
"""
from __future__ import annotations

import math

import torch

from ._ops import ops

_DTYPES = (torch.bfloat16, torch.float16)
_FORWARD_DIMS = (32, 64, 128, 256)
_BACKWARD_DIMS = (32, 64, 128)


def _tensor(name: str, t, dims: int, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} has {t.dim()} dimensions {tuple(t.shape)}; expected {dims}: {what}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} is {t.dtype}: flashcourse's kernels take torch.bfloat16 or torch.float16")
    if not t.is_cuda:
        raise ValueError(f"{name} is on {t.device}: flashcourse's kernels run on a CUDA device")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} has feature stride {t.stride(-1)}: its last dimension (d) must be contiguous; "
                         f"call .contiguous() on it")


def _same(q, name: str, t) -> None:
    if t.dtype != q.dtype:
        raise TypeError(f"{name} is {t.dtype} but q is {q.dtype}: q, k and v must have one dtype")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}: q, k and v must be on one device")


def _heads(hq: int, hk: int, d: int, dk: int, needs_grad: bool) -> None:
    if dk != d:
        raise ValueError(f"k has head dimension {dk} but q has {d}: q, k and v share d")
    if hq % hk:
        raise ValueError(f"q has {hq} heads and k, v have {hk}: the key/value heads must divide the query heads")
    dims = _BACKWARD_DIMS if needs_grad else _FORWARD_DIMS
    if d not in dims:
        extra = " (256 without gradients)" if needs_grad and d == 256 else ""
        raise ValueError(f"head dimension {d} is not supported{extra}: use {', '.join(map(str, dims))}")


def _options(scale, window, softcap, dropout_p, seed, offset, d: int) -> tuple:
    """(scale, left, right, softcap, dropout_p, seed, offset) as the operators take them."""
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
        raise ValueError(f"scale {scale!r} must be a finite nonzero number (or None: 1/sqrt(d))")
    if window is None:
        left, right = -1, -1
    else:
        try:
            left, right = (int(x) for x in window)
        except (TypeError, ValueError):
            raise TypeError(f"window {window!r} must be a pair (left, right) of whole numbers, -1 for no bound") from None
        if left < -1 or right < -1:
            raise ValueError(f"window {window!r}: each bound is a number of keys (0 or more), or -1 for none")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap {softcap!r} must be 0 (off) or a positive number")
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 255.5 / 256:
        raise ValueError(f"dropout_p {dropout_p!r} must be in [0, 255.5/256): the kernels compare one random byte "
                         f"per entry of P")
    if dropout_p > 0 and seed is None:
        # From PyTorch's generator, so that torch.manual_seed() fixes the mask.
        seed = int(torch.randint(0, 2 ** 62, (1,)).item())
    if not 0 <= int(offset) < 2 ** 32:
        raise ValueError(f"offset {offset!r} must fit in 32 bits")
    return float(scale), left, right, float(softcap), float(dropout_p), int(seed or 0), int(offset)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, *, layout: str = "bhnd", window: tuple | None = None,
                    softcap: float = 0.0, dropout_p: float = 0.0, seed: int | None = None, offset: int = 0,
                    return_lse: bool = False):
    """softmax(scale q k^T [masked]) v by the course's kernels, with autograd.

    layout "bhnd": q (B, Hq, Nq, d), k and v (B, Hk, Nk, d), as scaled_dot_product_attention takes
    them; "bnhd": (B, N, H, d), as flash_attn_func takes them. Either is read through its strides,
    without a copy, and the output has q's layout. causal: bottom-right aligned. scale: None for
    1/sqrt(d). window: (left, right) keys around each query's diagonal, -1 for no bound (causal sets
    right to 0). softcap: c in c tanh(s / c) on the scaled scores, 0 off. dropout_p: dropout on P by
    Philox from (seed, offset); seed None draws one from PyTorch's generator. return_lse: also the
    natural-log logsumexp of the scaled scores, (B, Hq, Nq) float32, without a gradient.
    """
    if layout not in ("bhnd", "bnhd"):
        raise ValueError(f"layout {layout!r} is not one the kernels read: use 'bhnd' (B, H, N, d) or 'bnhd' (B, N, H, d)")
    what = "(B, H, N, d)" if layout == "bhnd" else "(B, N, H, d)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _tensor(name, t, 4, what)
    _same(q, "k", k)
    _same(q, "v", v)
    if layout == "bnhd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k has batch {k.shape[0]} but q has {q.shape[0]}")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    _heads(q.shape[1], k.shape[1], q.shape[3], k.shape[3], needs_grad)
    options = _options(scale, window, softcap, dropout_p, seed, offset, q.shape[3])
    out, lse = ops.fwd(q, k, v, bool(causal), *options)
    if layout == "bnhd":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           scale: float | None = None, *, window: tuple | None = None, softcap: float = 0.0,
                           dropout_p: float = 0.0, seed: int | None = None, offset: int = 0, return_lse: bool = False):
    """A packed batch of sequences of different lengths, as flash_attn_varlen_func takes it.

    q (total_q, Hq, d), k and v (total_k, Hk, d); sequence b owns rows cu_seqlens_q[b] to
    cu_seqlens_q[b + 1] of q (int32 on q's device, B + 1 entries from 0) and the same of
    cu_seqlens_k in k and v; max_seqlen_q and max_seqlen_k bound every sequence. Causal and the
    window are bottom-right aligned in each sequence. The other options as flash_attention(); lse is
    (Hq, total_q). The call reads cu_seqlens on the host (the kernels' schedule is built there): it
    waits for the stream once.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _tensor(name, t, 3, "(total, H, d), a packed batch")
    _same(q, "k", k)
    _same(q, "v", v)
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} is {cu.dtype}: cu_seqlens are torch.int32")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} {tuple(cu.shape)} must be one dimension of B + 1 >= 2 entries")
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries and cu_seqlens_k {cu_seqlens_k.shape[0]}: "
                         f"both have B + 1")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"{name} {m!r} must be a whole number, 0 or more")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    _heads(q.shape[1], k.shape[1], q.shape[2], k.shape[2], needs_grad)
    options = _options(scale, window, softcap, dropout_p, seed, offset, q.shape[2])
    out, lse = ops.varlen_fwd(q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_seqlen_q, max_seqlen_k,
                              bool(causal), *options)
    return (out, lse) if return_lse else out
