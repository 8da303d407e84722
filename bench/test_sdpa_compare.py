#!/usr/bin/env python3
"""Checks of sdpa_compare.py that need neither a GPU nor torch: its doctests, and stage 10's
comparisons and tables on synthetic rows of three rounds as bench_gpu and the SDPA side write them
(grouped heads beside three backends, a window beside the plain causal kernels, dropout whose
backward stage 09 refuses, the packed batch beside the uniform one and SDPA's nested and padded
batches); stage 09's tables and ratios when --steps09 steps have their backward alone, and
docs/make_results.py's reading of those tables; round_ratios.py's reading of the logs (its
doctests) and its command line (Nsight Compute's scripts: bench/test_ncu.py). Run:
python3 bench/test_sdpa_compare.py"""
import contextlib
import csv
import doctest
import io
import math
import os
import sys
import tempfile
import types
import unittest
import unittest.mock
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdpa_compare as sc  # noqa: E402

REFUSED = "refused: --dropout 0.1: stage 09 does not apply dropout yet"


def row(impl, ms, pass_="forward", n=16384, d=64, dtype="bf16", flops=1e12, **extra):
    """A timed row (tflops from `flops` FLOPs in `ms`), or a refused one when ms is None."""
    r = dict(impl=impl, dtype=dtype, B=1 if n == 16384 else 4, H=2048 // d, N=n, d=d, causal=1, gpu="Test GPU", date="2026-11-25",
             median_ms=ms, min_ms=ms, max_ms=ms, tflops=None if ms is None else flops / (ms * 1e-3) * 1e-12, **{"pass": pass_})
    r.update(extra)
    return r


def one_round(k):
    """The rows of round k (0, 1, 2): SDPA a little slower each round, the rest alike."""
    rows = []
    for pass_, scale in (("forward", 1.0), ("backward", 2.5), ("fwd+bwd", 3.5)):
        rows += [row("stage10_causal", 2.0 * scale, pass_), row("stage10_window4095", 0.6 * scale, pass_, spec="1/4095/0"),
                 row("stage10_gqa8", 2.0 * scale, pass_, spec="8/-1/0")]
        for name, slower in (("flash", 1.1), ("cudnn", 0.8)):
            rows.append(row(f"sdpa_{name}_gqa8", 2.0 * scale * (slower + 0.01 * k), pass_, spec="8/-1/0"))
        rows.append(row("sdpa_efficient_gqa8", None, pass_, note="unsupported: No available kernel"))
        rows.append(row("stage10_dropout0.1", 2.8 if pass_ == "forward" else None, pass_, spec="1/-1/0/0/0.1",
                        **({} if pass_ == "forward" else dict(note=REFUSED))))
        rows.append(row("sdpa_flash_dropout0.1", 3.0 * scale, pass_, spec="1/-1/0/0/0.1"))
        rows += [row("stage10_varlen", 1.2 * scale, pass_), row("stage10_varlen_uniform", 0.78 * scale, pass_, flops=0.66e12),
                 row("stage10_dense_uniform", 0.74 * scale, pass_, flops=0.66e12),
                 row("sdpa_flash_varlen", 1.3 * scale, pass_),
                 row("sdpa_efficient_padded", 2.0 * scale, pass_, padded_bytes=3 << 20, packed_bytes=2 << 20),
                 row("sdpa_flash_padded", None, pass_, note="unsupported: flash has no attn_mask")]
    return rows


class Stage10Tables(unittest.TestCase):
    def setUp(self):
        self.rounds = [one_round(k) for k in range(3)]
        self.rows = sc.median_rows(self.rounds)
        self.comparisons = sc.stage10_comparisons(self.rows, self.rounds)
        self.by = {(c["kind"], c["ours"], c["other"], c["pass"]): c for c in self.comparisons}

    def test_ratios_over_rounds(self):
        c = self.by[("vs_sdpa", "stage10_gqa8", "sdpa_flash_gqa8", "fwd+bwd")]
        self.assertEqual(c["rounds"], 3)
        self.assertAlmostEqual(c["value"], 1.11)  # the middle round's SDPA over ours, by rate
        self.assertAlmostEqual(c["lo"], 1.10)
        self.assertAlmostEqual(c["hi"], 1.12)
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_gqa8", "sdpa_cudnn_gqa8", "forward")]["value"], 0.81)

    def test_window_against_causal_time(self):
        c = self.by[("vs_causal", "stage10_window4095", "stage10_causal", "forward")]
        self.assertAlmostEqual(c["value"], 0.3)
        self.assertAlmostEqual(self.by[("vs_causal", "stage10_window4095", "stage10_causal", "fwd+bwd")]["value"], 0.3)

    def test_refused_sides_keep_their_reason(self):
        ours = self.by[("vs_sdpa", "stage10_dropout0.1", "sdpa_flash_dropout0.1", "fwd+bwd")]
        self.assertEqual(ours["value"], "")
        self.assertEqual(ours["note"], REFUSED)
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_dropout0.1", "sdpa_flash_dropout0.1", "forward")]["value"], 3.0 / 2.8)
        sdpa = self.by[("vs_sdpa", "stage10_gqa8", "sdpa_efficient_gqa8", "forward")]
        self.assertEqual((sdpa["value"], sdpa["note"]), ("", "unsupported: No available kernel"))

    def test_packed_batch(self):
        dense = self.by[("vs_dense", "stage10_varlen", "stage10_dense_uniform", "forward")]
        self.assertAlmostEqual(dense["value"], (1.0 / 1.2) / (0.66 / 0.74))
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_varlen", "sdpa_flash_varlen", "backward")]["value"], 1.3 / 1.2)
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_varlen", "sdpa_efficient_padded", "forward")]["value"], 2.0 / 1.2)
        self.assertAlmostEqual(self.by[("memory", "stage10_varlen", "sdpa_efficient_padded", "forward")]["value"], 1.5)

    def test_tables_and_csv(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            sc.print_stage10_tables(self.comparisons, self.rows, "Test GPU", "2026-11-25")
        text = out.getvalue()
        lines = text.splitlines()
        gqa = next(x for x in lines if x.split()[:4] == ["gqa8", "bf16", "64", "16384"])
        self.assertIn("1.11 [1.10-1.12]", gqa)  # flash, forward: SDPA 1.10 to 1.12 times slower, 1.11 the median
        self.assertIn("unsupported", gqa)      # efficient refused
        window = next(x for x in lines if x.split()[:4] == ["window4095", "bf16", "64", "16384"])
        self.assertIn("0.30 [0.30-0.30]", window)
        self.assertTrue(window.endswith("met") and not window.endswith("not met"))
        self.assertIn("refused", next(x for x in lines if x.split()[:4] == ["dropout0.1", "bf16", "64", "16384"]))
        self.assertTrue(any("1.50x" in x for x in lines))  # the padded batch's memory over the packed one's
        self.assertIn(f"stage10_dropout0.1 backward, fwd+bwd: {REFUSED}", text)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "stage10.csv")
            sc.write_csv(path, self.comparisons, sc.STAGE10_COLUMNS)
            with open(path, newline="") as f:
                back = list(csv.DictReader(f))
        self.assertEqual(len(back), len(self.comparisons))
        self.assertEqual(list(back[0]), sc.STAGE10_COLUMNS)

    def test_no_stage10_rows(self):
        self.assertEqual(sc.stage10_comparisons([row("stage07", 1.0)], [[row("stage07", 1.0)]]), [])
        with contextlib.redirect_stdout(io.StringIO()):
            sc.print_stage10_tables([], [], "Test GPU", "2026-11-25")


# ----------------------------------------------------------------------------- stage 09's road (--steps09)
def stage09_round(k, full_steps=(5,), backward_only_steps=(3,), d=64):
    """The stage 09 rows of round k as bench_gpu and the SDPA side write them at one point: the
    default main kernel's four rows, SDPA flash and cuDNN's backward and pair, each step of
    `full_steps` with its three rows (backward, fwd+bwd, deterministic backward) and each of
    `backward_only_steps` with its backward alone (bench_gpu --steps09-backward-only)."""
    rows = [row("stage07", 1.0, d=d), row("stage09", 1.0, d=d), row("stage09", 2.0, "backward", d=d),
            row("stage09_deterministic", 2.2, "backward", d=d), row("stage09", 3.0, "fwd+bwd", d=d)]
    for name, slower in (("flash", 1.2), ("cudnn", 0.9)):
        rows += [row(f"sdpa_{name}", slower + 0.01 * k, d=d), row(f"sdpa_{name}", 2.0 * slower + 0.01 * k, "backward", d=d),
                 row(f"sdpa_{name}", 3.0 * slower + 0.01 * k, "fwd+bwd", d=d)]
    for s in full_steps:
        rows += [row(f"stage09_step{s}", 4.0, "backward", d=d, step=s, step_name="full", check="ok"),
                 row(f"stage09_step{s}", 5.0, "fwd+bwd", d=d, step=s, step_name="full"),
                 row(f"stage09_step{s}_deterministic", 4.4, "backward", d=d, step=s, step_name="full", check="ok")]
    for s in backward_only_steps:
        rows.append(row(f"stage09_step{s}", 2.4, "backward", d=d, step=s, step_name="backward only", check="ok"))
    return rows


class Stage09StepsBackwardOnly(unittest.TestCase):
    """stage 09's tables and ratios over rounds when some --steps09 steps have their backward with
    atomic dQ alone (no fwd+bwd row, no deterministic row): their tables keep every column with "-"
    where a row is missing, the ratios over rounds keep the backward's, and nothing raises."""

    def setUp(self):
        self.args = types.SimpleNamespace(stages=["07", "09"], dtypes=["bf16"], head_dims=[64], sizes=[16384], causal="yes",
                                          steps09=[3, 5], steps09_backward_only=True)
        self.rounds = [stage09_round(k) for k in range(3)]
        self.rows = sc.median_rows(self.rounds)

    def tables(self, fn, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            fn(self.args, *args, "Test GPU", "2026-11-25")
        return out.getvalue().splitlines()

    @staticmethod
    def table_of(lines, impl):
        """The heading and first row of `impl`'s table."""
        at = next(i for i, x in enumerate(lines) if x.startswith(impl + " in bf16"))
        return lines[at], lines[at + 1].split(), lines[at + 2].split()

    def test_step_tables(self):
        lines = self.tables(sc.print_stage09_tables, self.rows)
        title, head, cells = self.table_of(lines, "stage09_step3")
        self.assertIn("its backward alone", title)
        heads = ["d", "N", "causal", "f+b", "/09", "/flash", "bwd", "/09", "/flash", "bwd", "ms", "det", "ms", "det/at"]
        self.assertEqual(head, heads)
        self.assertEqual(cells, ["64", "16384", "True", "-", "-", "-", "%.1f" % (1e12 / 2.4e-3 * 1e-12),
                                 "0.83", "1.00", "2.400", "-", "-"])  # 2.0 / 2.4 ms; flash's middle round, 2.41 ms
        title, head, cells = self.table_of(lines, "stage09_step5")  # a step timed in full
        self.assertIn("atomic and deterministic dQ", title)
        self.assertEqual(head, heads)
        self.assertEqual(cells[-3:], ["4.000", "4.400", "1.10"])
        self.assertNotIn("-", cells)

    def test_road_table_of_make_results(self):
        """The tables printed are written as data beside the text (stage09_sweep_table.json), and
        docs/results_pages/ builds the lesson's road table from each step's backward there: the
        backward-only step is in it, its missing cells null, not "-"."""
        docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")
        sys.path.insert(0, docs)
        try:
            from results_pages import stage09, tables
        finally:
            sys.path.pop(0)
        sc.PRINTED.meta.update(gpu="Test GPU", date="2026-11-25", default_steps={"09": 9})
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "stage09_sweep_table.txt")
            with contextlib.redirect_stdout(io.StringIO()):
                sc.tee_to_file(path, sc.print_stage09_tables, self.args, self.rows, "Test GPU", "2026-11-25")
            road = tables.read_stage09_steps(os.path.join(tmp, "stage09_sweep_table.json"))
            table = stage09.road_table(road, os.path.join(tmp, "road.txt"))
        got = {r["step"]: r for r in road["rows"]}
        self.assertEqual(set(got), {9, 3, 5})  # the default's rows under the default step the run names
        self.assertAlmostEqual(got[3]["bwd"], 1e12 / 2.4e-3 * 1e-12)  # full precision: the data, not the print
        self.assertIsNone(got[3]["fb"])
        self.assertIsNone(got[3]["det_ms"])
        self.assertTrue(any(x.startswith("  step 3") and "%.1f" % got[3]["bwd"] in x for x in table))

    def test_no_step_rows_of_a_dtype(self):
        self.args.dtypes = ["bf16", "fp16"]  # no fp16 rows at all: no fp16 step table, no error
        lines = self.tables(sc.print_stage09_tables, self.rows)
        self.assertFalse(any(x.startswith("stage09_step3 in fp16") for x in lines))
        self.assertTrue(any(x.startswith("stage09_step3 in bf16") for x in lines))

    def test_ratios_over_rounds(self):
        lines = self.tables(sc.print_round_ratios, [[dict(r) for r in rows] for rows in self.rounds])
        heads = " ".join(x for x in lines if x.startswith("dtype"))
        self.assertIn("09s3/flash bwd", heads)
        self.assertNotIn("09s3/flash f+b", heads)
        self.assertIn("09s5/flash f+b", heads)
        worst = next(x for x in lines if x.startswith("worst median stage09_step3 / sdpa_flash (backward)"))
        self.assertIn("1.00 [1.00, 1.01]", worst)  # flash 2.40, 2.41, 2.42 ms over ours 2.40
        self.assertFalse(any(x.startswith("worst median stage09_step3 / sdpa_flash (fwd+bwd)") for x in lines))

    def test_every_step_backward_only(self):
        self.rows = sc.median_rows([stage09_round(k, full_steps=()) for k in range(3)])
        lines = self.tables(sc.print_stage09_tables, self.rows)
        self.assertEqual(sum(x.startswith("stage09_step") for x in lines), 1)

    def test_flag_passed_to_bench_gpu(self):
        calls = []

        def run(cmd):
            calls.append(cmd)
            with open(cmd[cmd.index("--json") + 1], "w") as f:
                f.write("{}")
            return types.SimpleNamespace(returncode=0)

        args = types.SimpleNamespace(bench_exe="bench_gpu", sizes=[4096], head_dims=[64], causal="yes", tokens=16384, width=2048,
                                     repeat=1, warmup=0, dtypes=["bf16"], model07=[], varlen07=[], steps=[], steps11=[],
                                     check=True, stages=["07", "09"], steps09=[0, 1], steps09_backward_only=True)
        with tempfile.TemporaryDirectory() as tmp, unittest.mock.patch.object(sc.subprocess, "run", run), \
                contextlib.redirect_stdout(io.StringIO()):
            out = os.path.join(tmp, "bench_gpu.json")
            sc.run_bench_gpu(args, None, out, os.path.join(tmp, "bench_gpu.csv"))
            args.steps09_backward_only = False
            sc.run_bench_gpu(args, None, out, os.path.join(tmp, "bench_gpu.csv"))
            args.steps09, args.steps09_backward_only = [], True  # no steps: nothing to pass it with
            sc.run_bench_gpu(args, None, out, os.path.join(tmp, "bench_gpu.csv"))
        self.assertEqual(calls[0][calls[0].index("--steps09"):][:4], ["--steps09", "0", "1", "--steps09-backward-only"])
        self.assertIn("--steps09", calls[1])
        self.assertNotIn("--steps09-backward-only", calls[1])
        self.assertNotIn("--steps09", calls[2])
        self.assertNotIn("--steps09-backward-only", calls[2])


# ----------------------------------------------------------------------------- the SDPA side, on a stand-in for torch
class FakeTensor:
    """Just enough of a torch tensor for sdpa_compare's stage 10 code: a shape (a nested tensor's
    ragged dimension is an object shared through its offsets), and the methods that code calls."""

    def __init__(self, *shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), dtype

    def to(self, dtype):
        return FakeTensor(*self.shape, dtype=dtype)

    def requires_grad_(self):
        return self

    def transpose(self, a, b):
        s = list(self.shape)
        s[a], s[b] = s[b], s[a]
        return FakeTensor(*s, dtype=self.dtype)

    def contiguous(self):
        return self

    def split(self, lengths):
        assert sum(lengths) == self.shape[0], (lengths, self.shape)
        return [FakeTensor(n, *self.shape[1:], dtype=self.dtype) for n in lengths]

    def view(self, *shape):
        known = math.prod(x for x in shape if x != -1)
        return FakeTensor(*(self.numel() // known if x == -1 else x for x in shape))

    def numel(self):
        return math.prod(self.shape)

    def element_size(self):
        return 2

    def fill_(self, _):
        return self

    def copy_(self, _):
        return self

    def _broadcast(self, other):
        a, b = self.shape, other.shape
        n = max(len(a), len(b))
        a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
        return FakeTensor(*(x if y == 1 else y for x, y in zip(a, b)), dtype="bool")

    __le__ = __lt__ = __and__ = _broadcast


class Ragged:
    """The ragged dimension of a nested tensor: one per offsets tensor, as torch's nested ints."""

    def __init__(self, batch):
        self.batch = batch


def fake_torch():
    """Modules torch, torch.nn, torch.nn.functional, torch.nn.attention standing in for PyTorch: SDPA
    checks the shapes it is given (grouped heads only with enable_gqa) and refuses a mask on the flash
    backend as PyTorch does (a warning, then RuntimeError); autograd.grad checks that dO has o's shape."""
    state = dict(backend=None)
    torch = types.ModuleType("torch")
    torch.__version__ = "fake"
    torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int64 = "float32", "bfloat16", "float16", "uint8", "int64"
    torch.OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})
    torch.manual_seed = lambda seed: None
    torch.randn = lambda *shape, **kw: FakeTensor(*shape)
    torch.empty = lambda *shape, **kw: FakeTensor(*shape)
    torch.empty_like = lambda t: FakeTensor(*t.shape, dtype=t.dtype)
    torch.arange = lambda n, **kw: FakeTensor(n)
    torch.tensor = lambda data, **kw: FakeTensor(len(data), dtype=kw.get("dtype", "int64"))
    torch.Generator = lambda **kw: types.SimpleNamespace(manual_seed=lambda seed: None)
    torch.no_grad = contextlib.nullcontext
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: True, get_device_name=lambda i: "Fake GPU", synchronize=lambda: None, empty_cache=lambda: None,
        get_device_properties=lambda i: types.SimpleNamespace(L2_cache_size=50 << 20))
    torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace()),
                                           cudnn=types.SimpleNamespace())

    ragged = {}  # id(offsets) -> (offsets, its ragged dimension)

    def nested_tensor_from_jagged(values, offsets):
        assert offsets.dtype == "int64" and len(offsets.shape) == 1
        _, j = ragged.setdefault(id(offsets), (offsets, Ragged(offsets.shape[0] - 1)))
        return FakeTensor(j.batch, j, *values.shape[1:], dtype=values.dtype)

    torch.nested = types.SimpleNamespace(nested_tensor_from_jagged=nested_tensor_from_jagged)

    def grad(o, leaves, do, retain_graph=False):
        assert o.shape == do.shape, (o.shape, do.shape)
        return tuple(FakeTensor(*t.shape) for t in leaves)

    torch.autograd = types.SimpleNamespace(grad=grad)

    def pad_sequence(parts, batch_first=False):
        return FakeTensor(len(parts), max(p.shape[0] for p in parts), *parts[0].shape[1:], dtype=parts[0].dtype)

    nn = types.ModuleType("torch.nn")
    nn.utils = types.SimpleNamespace(rnn=types.SimpleNamespace(pad_sequence=pad_sequence))
    functional = types.ModuleType("torch.nn.functional")

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        assert q.shape[0] == k.shape[0] == v.shape[0] and q.shape[3] == k.shape[3] and k.shape == v.shape
        assert q.shape[1] % k.shape[1] == 0 and (enable_gqa or q.shape[1] == k.shape[1])
        assert not (attn_mask is not None and is_causal)
        if attn_mask is not None and state["backend"] == "flash":
            warnings.warn("Flash attention kernel not used because:")
            warnings.warn("Flash attention does not support attn_mask.")
            raise RuntimeError("No available kernel. Aborting execution.")
        return FakeTensor(*q.shape, dtype=q.dtype)

    functional.scaled_dot_product_attention = sdpa
    attention = types.ModuleType("torch.nn.attention")
    attention.SDPBackend = types.SimpleNamespace(FLASH_ATTENTION="flash", CUDNN_ATTENTION="cudnn", EFFICIENT_ATTENTION="efficient",
                                                 MATH="math")

    @contextlib.contextmanager
    def sdpa_kernel(backend):
        state["backend"] = backend
        yield
        state["backend"] = None

    attention.sdpa_kernel = sdpa_kernel
    torch.nn, nn.functional, nn.attention = nn, functional, attention
    return {"torch": torch, "torch.nn": nn, "torch.nn.functional": functional, "torch.nn.attention": attention}


class Stage10SdpaSide(unittest.TestCase):
    """run_sdpa_stage10 on bench_gpu's stage 10 points, through the stand-in for torch (times: 1 ms)."""

    def test_rows(self):
        args = types.SimpleNamespace(warmup=1, repeat=1, varlen07=[100, 50, 30], head_dims=[64], dtypes=["bf16"], width=2048)
        ours = [row("stage10_causal", 1.0, n=4096), row("stage10_gqa8", 1.0, n=4096, spec="8/-1/0"),
                row("stage10_window4095", 1.0, n=4096, spec="1/4095/0"),
                row("stage10_dropout0.1", 1.0, n=4096, spec="1/-1/0/0/0.1"), row("stage10_varlen", 1.0, n=180)]
        with unittest.mock.patch.dict(sys.modules, fake_torch()), \
                unittest.mock.patch.object(sc, "time_torch", lambda fn, warmup, repeat, flush: (fn(), (1.0, 1.0, 1.0))[1]), \
                contextlib.redirect_stdout(io.StringIO()):
            rows = sc.run_sdpa_stage10(args, ours, "Fake GPU", "2026-11-25")
        got = {(r["impl"], r["pass"]): r for r in rows}
        for impl in ("sdpa_flash_gqa8", "sdpa_cudnn_gqa8", "sdpa_efficient_gqa8", "sdpa_flash_causal", "sdpa_flash_dropout0.1",
                     "sdpa_flash_varlen", "sdpa_efficient_padded"):
            for pass_ in sc.STAGE10_PASSES:
                self.assertIn("tflops", got[(impl, pass_)], (impl, pass_, got[(impl, pass_)].get("note")))
        self.assertFalse(any("window" in impl or impl == "sdpa_cudnn_dropout0.1" for impl, _ in got))
        gqa = got[("sdpa_flash_gqa8", "fwd+bwd")]
        self.assertEqual((gqa["B"], gqa["H"], gqa["N"]), (4, 32, 4096))
        self.assertAlmostEqual(gqa["tflops"], 4.0 * 64 * 4 * 32 * 4096 * 4097 / 2 * 3.5 / 1e-3 * 1e-12)
        refused = got[("sdpa_flash_padded", "backward")]
        self.assertNotIn("tflops", refused)
        self.assertEqual(refused["note"], "unsupported: No available kernel. Aborting execution. "
                                          "(Flash attention does not support attn_mask.)")
        padded = got[("sdpa_efficient_padded", "forward")]
        self.assertEqual(padded["packed_bytes"], 4 * 180 * 32 * 64 * 2)
        self.assertEqual(padded["padded_bytes"], 4 * 3 * 32 * 100 * 64 * 2 + 3 * 100 * 100 * 2)
        self.assertIn("padded to 100", padded["note"])
        self.assertAlmostEqual(got[("sdpa_flash_varlen", "forward")]["tflops"],
                               4.0 * 64 * 32 * (100 * 101 + 50 * 51 + 30 * 31) / 2 / 1e-3 * 1e-12)


FAKE_BENCH = r'''#!/usr/bin/env python3
# Stands in for bench_gpu: records its arguments and writes stage 10's rows as bench_gpu names them.
import json, sys
argv = sys.argv[1:]
out = argv[argv.index("--json") + 1]
open(out + ".args", "a").write(" ".join(argv) + "\n")
rows = []
for t in ("bf16", "fp16"):
    for impl, spec, ms in (("stage10_causal", "", 2.0), ("stage10_gqa8", "8/-1/0", 2.1), ("stage10_window4095", "1/4095/0", 0.6),
                           ("stage10_dropout0.1", "1/-1/0/0/0.1", 2.8), ("stage10_varlen", "", 1.2),
                           ("stage10_dense_uniform", "", 0.8)):
        for p, f in (("forward", 1.0), ("backward", 2.5), ("fwd+bwd", 3.5)):
            refused = impl == "stage10_dropout0.1" and p != "forward"
            r = dict(impl=impl, dtype=t, B=1, H=32, N=16384 if "varlen" not in impl and "uniform" not in impl else 180, d=64,
                     causal=True, median_ms=None if refused else ms * f, min_ms=None, max_ms=None,
                     tflops=None if refused else 100.0, sm_clock_mhz=1980, **{"pass": p})
            if spec:
                r["spec"] = spec
            if refused:
                r["note"] = "refused: dropout is not applied by this backward yet"
            rows.append(r)
json.dump(dict(gpu="Fake GPU", date="2026-11-25", max_sm_clock_mhz=1980, method="fake", stage07_final_step=8,
               stage07_road=[], results=rows), open(out, "w"))
open(argv[argv.index("--csv") + 1], "w").write("impl\n")
'''


class Stage10Main(unittest.TestCase):
    """main() with --stages 10 over two rounds: a stand-in bench_gpu, the stand-in torch; the files it writes."""

    def test_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            bench = os.path.join(tmp, "bench_gpu")
            with open(bench, "w") as f:
                f.write(FAKE_BENCH)
            os.chmod(bench, 0o755)
            argv = ["sdpa_compare.py", "--bench-exe", bench, "--out-dir", tmp, "--stages", "10", "--dtypes", "bf16", "fp16",
                    "--sizes", "16384", "--head-dims", "64", "--causal", "yes", "--model07", "8/-1/0", "1/4095/0",
                    "1/-1/0/0/0.1", "--varlen07", "100,50,30", "--rounds", "2", "--repeat", "1", "--warmup", "0"]
            with unittest.mock.patch.dict(sys.modules, fake_torch()), unittest.mock.patch.object(sys, "argv", argv), \
                    unittest.mock.patch.object(sc, "time_torch", lambda fn, warmup, repeat, flush: (fn(), (1.0, 1.0, 1.0))[1]), \
                    contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(sc.main(), 0)
            with open(os.path.join(tmp, "bench_gpu.json.args")) as f:
                calls = f.read().splitlines()
            self.assertEqual(len(calls), 2)
            self.assertIn("--stages 09 ", calls[0])
            self.assertIn("--model07 8/-1/0 --model07 1/4095/0 --model07 1/-1/0/0/0.1 --varlen07 100,50,30", calls[0])
            with open(os.path.join(tmp, "stage10.txt")) as f:
                text = f.read()
            with open(os.path.join(tmp, "stage10.csv"), newline="") as f:
                comparisons = list(csv.DictReader(f))
            with open(os.path.join(tmp, "gpu_sweep.csv"), newline="") as f:
                sweep = list(csv.DictReader(f))
        self.assertIn("window4095", text)
        self.assertIn("stage10_dropout0.1 backward, fwd+bwd: refused: dropout is not applied by this backward yet", text)
        kinds = {(c["kind"], c["ours"], c["other"]) for c in comparisons}
        for k in (("vs_sdpa", "stage10_gqa8", "sdpa_cudnn_gqa8"), ("vs_sdpa", "stage10_causal", "sdpa_efficient_causal"),
                  ("vs_causal", "stage10_window4095", "stage10_causal"), ("vs_sdpa", "stage10_varlen", "sdpa_flash_varlen"),
                  ("vs_dense", "stage10_varlen", "stage10_dense_uniform"), ("memory", "stage10_varlen", "sdpa_efficient_padded")):
            self.assertIn(k, kinds)
        window = next(c for c in comparisons if c["kind"] == "vs_causal" and c["pass"] == "forward" and c["dtype"] == "bf16")
        self.assertEqual((window["value"], window["rounds"]), ("0.3", "2"))
        self.assertIn("sdpa_flash_gqa8", {r["impl"] for r in sweep})
        self.assertEqual({r["spec"] for r in sweep if r["impl"] == "stage10_gqa8"}, {"8/-1/0"})


def load_tests(loader, tests, ignore):
    import round_ratios
    tests.addTests(doctest.DocTestSuite(sc))
    tests.addTests(doctest.DocTestSuite(round_ratios))
    return tests


def write_files(folder, suffix, *texts):
    """Each text into a file of its own in `folder` (a.<suffix>, b.<suffix>, ...); their paths."""
    paths = []
    for n, text in enumerate(texts):
        path = os.path.join(folder, f"{chr(ord('a') + n)}.{suffix}")
        with open(path, "w") as f:
            f.write(text)
        paths.append(path)
    return paths


class Stage11StepsOverRounds(unittest.TestCase):
    """With several --steps11, the ratios over rounds hold stage 11's default against each other step
    timed beside it (step 0, stage 07's kernel, is held as 11/07 already)."""

    def test_default_over_each_step(self):
        args = types.SimpleNamespace(stages=["11"], dtypes=["bf16"], head_dims=[64], sizes=[1024], causal="no")
        rounds = [[row("stage11", 1.0, n=1024, causal=0), row("stage11_step15", 1.07 + 0.01 * k, n=1024, causal=0),
                   row("stage11_step9", 1.5, n=1024, causal=0), row("stage11_step0", 1.4, n=1024, causal=0),
                   row("sdpa_cudnn", 1.04, n=1024, causal=0)] for k in range(3)]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            sc.print_round_ratios(args, rounds, "Test GPU", "2026-11-27")
        lines = out.getvalue().splitlines()
        head = next(x for x in lines if x.startswith("dtype")).split()
        self.assertEqual(head[4:], ["11/cudnn", "11/flash", "11/07", "11/11s9", "11/11s15"])
        cells = next(x for x in lines if x.split()[:4] == ["bf16", "64", "1024", "False"])
        self.assertIn("1.08 [1.07, 1.09]", cells)  # step 15 at 1.07, 1.08 and 1.09 ms, the default at 1.00
        self.assertIn("1.50 [1.50, 1.50]", cells)
        self.assertIn("1.40 [1.40, 1.40]", cells)  # 11/07 from step 0's rows
        self.assertTrue(any(x.startswith("worst median stage11 / stage11_step15 ratio over rounds: 1.08") for x in lines))


class RoundRatiosTest(unittest.TestCase):
    """round_ratios.py on a log of two rounds, as bench/session.py's road11 writes it."""

    LOG = """round 1 of 2
[  2/ 8] stage11_step15  bf16 d=64  N=1024  B=16 H=32 non-causal     0.320 ms  430.12 TFLOP/s  (min 0.318, max 0.359; SM 1980 MHz)  step 15 split ring
          vs stage 07 (bf16): O max_abs 1.95e-03 (limit 3.12e-02), rel_l2 1.33e-03; LSE max_abs 1.91e-06
[  3/ 8] stage11         bf16 d=64  N=1024  B=16 H=32 non-causal     0.299 ms  459.95 TFLOP/s  (min 0.297, max 0.316; SM 1980 MHz)  step 16 idle past Nq
[ 1/4] sdpa d=64 N=1024 non-causal: flash/bf16=286.8 cudnn/bf16=436.4 flash/fp16=286.8 cudnn/fp16=438.2 TFLOP/s
round 2 of 2
[  3/ 8] stage11         bf16 d=64  N=1024  B=16 H=32 non-causal     0.300 ms  441.00 TFLOP/s  (min 0.297, max 0.316; SM 1980 MHz)  step 16 idle past Nq
[  4/ 8] stage11_step15  bf16 d=64  N=1024  B=16 H=32 non-causal     0.320 ms  420.00 TFLOP/s  (min 0.318, max 0.359; SM 1980 MHz)  step 15 split ring
[ 1/4] sdpa d=64 N=1024 non-causal: flash/bf16=280.0 cudnn/bf16=441.0 flash/fp16=286.8 cudnn/fp16=438.2 TFLOP/s
"""

    def test_each_round_and_a_missing_name(self):
        import round_ratios as rr
        with tempfile.TemporaryDirectory() as folder:
            (path,) = write_files(folder, "log", self.LOG)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rr.main(["stage11", "stage11_step15", path])
            self.assertEqual(out.getvalue().splitlines()[1].split()[-2:], ["1.069", "1.050"])
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rr.main(["stage11", "sdpa_cudnn", path])
            self.assertEqual(out.getvalue().splitlines()[1].split()[-2:], ["1.054", "1.000"])
            with self.assertRaises(SystemExit):
                rr.main(["stage11", "sdpa_math", path])
            with self.assertRaises(SystemExit):
                rr.main(["stage11"])


if __name__ == "__main__":
    unittest.main()
