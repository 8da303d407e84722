"""torch.ops.flashcourse.* on the GPU, checked by PyTorch's own tools and against SDPA.

    python3 -m pytest python/tests           (after `python3 -m pip install --no-build-isolation ./python`)

Skipped whole without PyTorch, a CUDA GPU or the built package. The rule is the course's
low-precision one (COURSE.md, common/src/tolerance.cpp): the error against float64, computed from
the same bf16/fp16-rounded inputs, within twice the error of the same attention computed naively in
that precision, plus a floor of one rounding of the largest value compared.
"""
import itertools
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("flashcourse's operators need a CUDA GPU", allow_module_level=True)
flashcourse = pytest.importorskip("flashcourse")

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from flashcourse import flash_attention, flash_attention_varlen, ops  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16)
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}  # unit roundoff
# (Nq, Nk): one row, primes, Nq != Nk both ways, sizes that divide no block.
SHAPES = ((1, 1), (1, 37), (37, 1), (97, 131), (131, 97), (200, 200))


def inputs(b, hq, hk, nq, nk, d, dtype, seed=0):
    """q, k, v and dO rounded to dtype (never zeros), and their float64 copies."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, n, d, generator=g) for h, n in ((hq, nq), (hk, nk), (hk, nk), (hq, nq)))
    low = [t.to(dtype).cuda() for t in (q, k, v, do)]
    return low, [t.double() for t in low]


def visible(nq, nk, causal, window=(-1, -1), device="cuda"):
    """(Nq, Nk) bool: query i sees key j (bottom-right aligned: the diagonal of row i is key i + Nk - Nq)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    diag = i + (nk - nq)
    ok = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if right >= 0:
        ok &= j <= diag + right
    if left >= 0:
        ok &= j >= diag - left
    return ok


def naive(q, k, v, causal, scale, window=(-1, -1), softcap=0.0):
    """Attention as its formula, in q's dtype (float64 for the reference): (O, LSE). Grouped heads are
    repeated; a row that sees no key gets O = 0 and LSE = -inf with zero gradients."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    mask = visible(q.shape[2], k.shape[2], causal, window)
    has_key = mask.any(-1)
    s = s.masked_fill(~mask, float("-inf")).masked_fill(~has_key[:, None], 0.0)
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, -1)
    p = torch.softmax(s.float() if s.dtype != torch.float64 else s, -1).to(q.dtype) * has_key[:, None]
    lse = lse.masked_fill(~has_key, float("-inf"))
    return p @ v, lse


def sdpa_reference(q, k, v, causal, scale):
    """SDPA's math backend in float64, causal as an explicit bottom-right mask (SDPA's is_causal is
    top-left); rows that see no key set to 0 (SDPA gives them NaN)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    mask = visible(q.shape[2], k.shape[2], causal)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return torch.where(mask.any(-1)[:, None], o, torch.zeros_like(o))


def within_rule(name, ours, ref, low, dtype):
    """|ours - ref| <= 2 |low - ref| + u max|ref| (+ a float32 floor), elementwise maxima; rows of -inf equal."""
    ours, ref, low = ours.double(), ref.double(), low.double()
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(ours), fin), f"{name}: non-finite entries differ from the reference"
    if not fin.any():
        return
    err = (ours - ref)[fin].abs().max().item()
    base = (low - ref)[fin].abs().max().item()
    limit = 2 * base + UNIT[dtype] * ref[fin].abs().max().item() + 1e-6
    assert err <= limit, f"{name}: max error {err:.3g} above {limit:.3g} (naive {dtype}: {base:.3g})"


@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp16"))
@pytest.mark.parametrize("d", (64, 128))
@pytest.mark.parametrize("layout", ("bhnd", "bnhd"))
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
@pytest.mark.parametrize("nq,nk", SHAPES)
def test_forward_against_sdpa(dtype, d, layout, causal, nq, nk):
    (q, k, v, _), (q64, k64, v64, _) = inputs(2, 4, 4, nq, nk, d, dtype)
    scale = 1 / math.sqrt(d)
    args = [t.transpose(1, 2).contiguous() if layout == "bnhd" else t for t in (q, k, v)]
    out, lse = flash_attention(*args, causal=causal, layout=layout, return_lse=True)
    if layout == "bnhd":
        assert out.shape == args[0].shape and out.is_contiguous()
        out = out.transpose(1, 2)
    o_low, lse_low = naive(q, k, v, causal, scale)
    _, lse_ref = naive(q64, k64, v64, causal, scale)
    within_rule("O", out, sdpa_reference(q64, k64, v64, causal, scale), o_low, dtype)
    within_rule("LSE", lse, lse_ref, lse_low, dtype)
    if causal and nq > nk:  # rows that see no key: exactly 0, LSE -inf
        empty = ~visible(nq, nk, True).any(-1)
        assert torch.all(out[:, :, empty] == 0) and torch.all(lse[:, :, empty] == float("-inf"))


def check_gradients(dtype, d, layout, causal, nq, nk, hq=4, hk=4, window=(-1, -1), softcap=0.0):
    (q, k, v, do), (q64, k64, v64, do64) = inputs(2, hq, hk, nq, nk, d, dtype, seed=1)
    scale = 1 / math.sqrt(d)
    grads = {}
    for name, ts, fn in (
        ("ours", (q, k, v), lambda a, b, c: flash_attention(a, b, c, causal, window=window, softcap=softcap)),
        ("low", (q, k, v), lambda a, b, c: naive(a, b, c, causal, scale, window, softcap)[0]),
        ("ref", (q64, k64, v64), lambda a, b, c: naive(a, b, c, causal, scale, window, softcap)[0]),
    ):
        leaves = [t.clone().requires_grad_() for t in ts]
        if name == "ours" and layout == "bnhd":  # the same values held (B, N, H, d)
            held = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in ts]
            out = flash_attention(*held, causal=causal, layout="bnhd", window=window, softcap=softcap).transpose(1, 2)
            leaves = held
        else:
            out = fn(*leaves)
        out.backward(do64 if name == "ref" else do)
        g = [t.grad.transpose(1, 2) if name == "ours" and layout == "bnhd" else t.grad for t in leaves]
        grads[name] = (out.detach(), *g)
    for i, what in enumerate(("O", "dQ", "dK", "dV")):
        within_rule(what, grads["ours"][i], grads["ref"][i], grads["low"][i], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp16"))
@pytest.mark.parametrize("d", (64, 128))
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
@pytest.mark.parametrize("nq,nk", ((1, 1), (37, 1), (97, 131), (131, 97)))
def test_gradients_against_float64(dtype, d, causal, nq, nk):
    check_gradients(dtype, d, "bhnd", causal, nq, nk)


@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp16"))
def test_gradients_bnhd_and_grouped_heads(dtype):
    check_gradients(dtype, 64, "bnhd", True, 131, 97)
    check_gradients(dtype, 128, "bhnd", True, 97, 131, hq=8, hk=2)  # GQA: dK, dV summed over the group
    check_gradients(dtype, 64, "bnhd", False, 64, 64, hq=6, hk=1)   # MQA


@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp16"))
def test_window_and_softcap(dtype):
    check_gradients(dtype, 64, "bhnd", False, 150, 170, window=(20, 5))
    check_gradients(dtype, 64, "bhnd", True, 170, 150, window=(30, -1))
    check_gradients(dtype, 128, "bhnd", True, 100, 100, softcap=5.0)


def test_dropout_is_fixed_by_its_seed():
    (q, k, v, do), _ = inputs(2, 4, 4, 128, 128, 64, torch.bfloat16)
    runs = []
    for seed in (3, 3, 4):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, causal=True, dropout_p=0.2, seed=seed)
        out.backward(do)
        runs.append([out] + [t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not torch.equal(runs[0][0], runs[2][0])
    plain = flash_attention(q, k, v, causal=True)
    assert not torch.equal(runs[0][0], plain)


@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp16"))
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_varlen_against_each_sequence(dtype, causal):
    lens_q, lens_k = [37, 1, 130, 64], [50, 1, 97, 64]
    hq, hk, d = 8, 2, 64
    g = torch.Generator(device="cpu").manual_seed(5)
    q, k, v, do = (torch.randn(sum(n), h, d, generator=g).to(dtype).cuda()
                   for n, h in ((lens_q, hq), (lens_k, hk), (lens_k, hk), (lens_q, hq)))
    cu = [torch.tensor([0, *itertools.accumulate(x)], dtype=torch.int32, device="cuda") for x in (lens_q, lens_k)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention_varlen(*leaves, cu[0], cu[1], max(lens_q), max(lens_k), causal=causal)
    out.backward(do)
    for b in range(len(lens_q)):
        rq = slice(int(cu[0][b]), int(cu[0][b + 1]))
        rk = slice(int(cu[1][b]), int(cu[1][b + 1]))
        seq = [t[r].transpose(0, 1)[None] for t, r in ((q, rq), (k, rk), (v, rk))]  # (1, H, N, d)
        mine = flash_attention(*[t.clone().requires_grad_() for t in seq], causal=causal)
        o_low = naive(*seq, causal, 1 / math.sqrt(d))[0]
        ref = sdpa_reference(*[t.double() for t in seq], causal, 1 / math.sqrt(d))
        within_rule(f"O of sequence {b}", out[rq].transpose(0, 1)[None], ref, o_low, dtype)
        within_rule(f"O of sequence {b} alone", mine, ref, o_low, dtype)
    for t in leaves:
        assert t.grad is not None and torch.isfinite(t.grad).all()


def _opcheck_inputs():
    (q, k, v, do), _ = inputs(2, 4, 2, 65, 70, 64, torch.bfloat16)
    return q, k, v, do


def test_opcheck_fwd_and_bwd():
    q, k, v, do = _opcheck_inputs()
    options = (True, 0.125, -1, -1, 0.0, 0.0, 0, 0)
    torch.library.opcheck(ops.fwd, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), *options))
    out, lse = ops.fwd(q.detach(), k.detach(), v.detach(), *options)
    torch.library.opcheck(ops.bwd, (do, q.detach(), k.detach(), v.detach(), out, lse, *options, False))
    bnhd = [t.detach().transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]  # flash-attn's strides
    torch.library.opcheck(ops.fwd, (*bnhd, False, 0.125, 10, 3, 0.0, 0.0, 0, 0))


def test_opcheck_varlen():
    lens = torch.tensor([0, 5, 40, 41], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cpu").manual_seed(7)
    q, k, v, do = (torch.randn(41, h, 64, generator=g).to(torch.float16).cuda() for h in (4, 2, 2, 4))
    options = (36, 36, True, 0.125, -1, -1, 0.0, 0.0, 0, 0)
    torch.library.opcheck(ops.varlen_fwd, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), lens, lens,
                                           *options))
    out, lse = ops.varlen_fwd(q.detach(), k.detach(), v.detach(), lens, lens, *options)
    torch.library.opcheck(ops.varlen_bwd, (do, q.detach(), k.detach(), v.detach(), out, lse, lens, lens, *options, True))


class Block(torch.nn.Module):
    """A projection, the course's attention, a projection: what a model calls."""

    def __init__(self, width=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        b, n, w = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).unbind(2)
        return self.proj(flash_attention(q, k, v, causal=True, layout="bnhd").reshape(b, n, w))


def test_compile_fullgraph():
    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16)
    x = torch.randn(2, 100, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = block(x)
    eager.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    assert torch.allclose(out, eager, atol=2e-2, rtol=2e-2)
    assert torch.allclose(x.grad, grad, atol=2e-2, rtol=2e-2)


def test_export():
    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16).eval()
    x = torch.randn(2, 100, 256, device="cuda", dtype=torch.bfloat16)
    program = torch.export.export(block, (x,))
    assert "flashcourse.fwd" in str(program.graph)
    assert torch.allclose(program.module()(x), block(x))


def test_bad_inputs_name_the_argument():
    (q, k, v, _), _ = inputs(1, 4, 4, 64, 64, 64, torch.bfloat16)
    with pytest.raises(TypeError, match="q is torch.float32"):
        flash_attention(q.float(), k, v)
    with pytest.raises(TypeError, match="k is torch.float16 but q is torch.bfloat16"):
        flash_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="v is on cpu"):
        flash_attention(q, k, v.cpu())
    with pytest.raises(ValueError, match="q has 4 heads and k, v have 3"):
        flash_attention(q, k[:, :3], v[:, :3])
    (q96, k96, v96, _), _ = inputs(1, 4, 4, 64, 64, 96, torch.bfloat16)
    with pytest.raises(ValueError, match="head dimension 96 is not supported"):
        flash_attention(q96, k96, v96)
    with pytest.raises(ValueError, match="k has feature stride"):
        flash_attention(q, k.transpose(2, 3), v)
    with pytest.raises(ValueError, match="layout 'nhd'"):
        flash_attention(q, k, v, layout="nhd")
    with pytest.raises(ValueError, match="q has 3 dimensions"):
        flash_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="dropout_p 1.0"):
        flash_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(RuntimeError, match="flashcourse.fwd: q does not start on a 16-byte boundary"):
        odd = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)[1:].view(q.shape)
        ops.fwd(odd, k, v, False, 0.125, -1, -1, 0.0, 0.0, 0, 0)
    with pytest.raises(RuntimeError, match="flashcourse.fwd: k has stride 68 in dimension 2"):
        rows_of_68 = torch.empty(4 * 64 * 68, device="cuda", dtype=q.dtype).as_strided((1, 4, 64, 64), (4 * 64 * 68, 64 * 68, 68, 1))
        ops.fwd(q, rows_of_68, v, False, 0.125, -1, -1, 0.0, 0.0, 0, 0)
    cu = torch.tensor([0, 64], dtype=torch.int64, device="cuda")
    with pytest.raises(TypeError, match="cu_seqlens_q is torch.int64"):
        flash_attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu.int(), 64, 64)
    with pytest.raises(RuntimeError, match="more than max_seqlen_q = 10"):
        ops.varlen_fwd(q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(),
                       v[0].transpose(0, 1).contiguous(), cu.int(), cu.int(), 10, 64, False, 0.125, -1, -1, 0.0, 0.0,
                       0, 0)
