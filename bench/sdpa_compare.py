#!/usr/bin/env python3
"""Our GPU stages beside PyTorch SDPA on the same GPU, in the same run, timed the same way.

Runs mma_ceiling (when built: the mma.sync bf16 rate every stage 07 figure is also given as a
fraction of), then bench_gpu (our kernels: stages 05/06 in float32, stage 07 in bf16 and fp16,
at its final kernel or at the steps of its road, stage 09's backward after stage 07's forward),
then, where torch is importable, PyTorch's scaled_dot_product_attention pinned to one backend at
a time with torch.nn.attention.sdpa_kernel, on the same shapes:

  for stages 05/06 (float32)  efficient and math in fp32 (flash and cudnn have no fp32 kernel:
                              recorded as unsupported), and flash and cudnn in bf16 for scale
  for stage 07 (--dtypes)     flash and cudnn in each of bf16 and fp16
  for stage 11 (--dtypes)     the same: the Hopper kernel is held against cuDNN above all
  for stage 09 (--dtypes)     the same forward, and flash and cudnn in each of bf16 and fp16:
                              the backward alone (torch.autograd.grad(o, (q, k, v), do,
                              retain_graph=True) after one forward) and forward + backward timed
                              as one pair, as bench_gpu times stage 07 + stage 09
  for stage 10 (--stages 10)  stage 10's points as bench_gpu timed them (--model07, --varlen07;
                              bench_gpu runs with stage 09), forward, backward and the pair:
                              grouped heads through enable_gqa=True pinned to flash, cudnn and
                              efficient, dropout through flash's dropout_p, the packed batch as
                              nested jagged tensors and padded to its longest sequence with a mask;
                              windows have no SDPA counterpart (ours against our causal time)

Every point is timed with CUDA events after warm-up runs, with the L2 flushed (a buffer four
times the L2 overwritten) before each timed run, and the median of the runs is kept: the method
bench_gpu uses. FLOPs follow fa::attention_flops: 4*B*H*N*N*d, halved for causal; the backward
counts 2.5 times that, forward + backward 3.5 times (fa::attention_flops_backward,
fa::attention_flops_fwd_bwd). A backend that refuses a dtype or shape is recorded with an empty
time and the reason in the note.

Writes to OUT_DIR:
  gpu_sweep.csv, gpu_sweep.json  every row (columns impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,
                                 sm_clock_mhz,date as before, then step,step_name,min_ms,max_ms,
                                 check,check_max_abs,check_rel_l2,note,pass; pass is forward,
                                 backward or fwd+bwd, and an older file without it holds forward
                                 rows only)
  road.csv, road.json            when several stage 07 steps were timed: each step's TFLOP/s per
                                 shape and its gain over the step before (tuning candidates: over
                                 the final kernel), beside SDPA flash
  stage07_sweep_table.txt,       the printed tables of stage 07 and stage 09 against SDPA
  stage09_sweep_table.txt
  stage11_sweep_table.txt        stage 11 against SDPA cuDNN and flash and stage 07, per dtype
  ratios_over_rounds.txt         with several rounds: each ratio's median over rounds, min and max
  stage10.txt, stage10.csv       with stage 10: its tables, and each of its ratios (ours / SDPA,
                                 a window over the causal time, the packed batch over the uniform
                                 one, the padded batch's bytes) with its median, min and max over
                                 the rounds; its rows count the FLOPs of the visible pairs only
  road11.csv, road11.json,       when several stage 11 steps were timed (--steps11): each step's
  stage11_road_table.txt         TFLOP/s, its gain over the step before and its ratio to cuDNN
  mma_ceiling.jsonl              what mma_ceiling measured
  wgmma_ceiling.jsonl            what wgmma_ceiling measured (with stage 11)
  bench_gpu.csv, bench_gpu.json  bench_gpu's own output
  tables.json                    the cells of every table printed (bench/records.py: kinds fp32, stage07,
                                 stage09_pair, stage09_step, stage11, ratios, refused, worst, ...), with
                                 the run's GPU, date, command, rounds, size and default steps; and beside
                                 each table file above (stage09_sweep_table.txt ...) a .json of its own
                                 tables: what docs/results_pages/ reads, never the printed text
and prints the tables: float32 stages against SDPA efficient, stage 07 against SDPA flash and
cuDNN per dtype (with the worst ratio), the road, and stage 07 + 09 against SDPA flash and cuDNN
forward + backward (with the backward alone and the deterministic backward beside it). The exit
code is 1 when a bench_gpu point failed its check (the files are written all the same).

Ratios come from runs interleaved in one process: the whole sequence (bench_gpu, then SDPA) runs
--rounds times (default 3). Each point's row in the files is that of the round with the median
time; ratios_over_rounds.txt (stages 07, 09 and 11) gives each ratio the targets name as its median over
the rounds, each taken between the two timings of one round, with its min and max. bench_gpu.csv
and bench_gpu.json are the last round's.
"""
import argparse
import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records  # noqa: E402  (bench/records.py: the tables as data)
from records import Column, Table  # noqa: E402

CSV_COLUMNS = ["impl", "dtype", "B", "H", "N", "d", "causal", "median_ms", "tflops", "gpu", "sm_clock_mhz", "date",
               "step", "step_name", "min_ms", "max_ms", "check", "check_max_abs", "check_rel_l2", "note", "pass", "spec"]
ROAD_COLUMNS = ["kind", "impl", "step", "step_name", "idea", "dtype", "d", "N", "causal", "tflops", "median_ms", "gain", "gain_over",
                "vs_flash", "pct_of_mma", "gpu", "sm_clock_mhz", "date"]
# Stage 11's road: the same columns, with the ratio to cuDNN (its target) and the fraction of the
# wgmma ceiling (step 0, stage 07's mma.sync kernel, keeps its fraction of the mma.sync one).
ROAD11_COLUMNS = ROAD_COLUMNS[:-3] + ["vs_cudnn", "pct_of_wgmma", "check"] + ROAD_COLUMNS[-3:]
FP32_STAGES = ("05", "06")
HALF_STAGES = ("07", "09", "11")  # the stages that run in --dtypes, beside SDPA flash and cuDNN in the same types
# FLOPs of each pass as a multiple of the forward's: five products of 2*N*N*d per head to the
# forward's two, recomputing S included (fa::attention_flops_backward, fa::attention_flops_fwd_bwd).
PASS_FLOPS = {"forward": 1.0, "backward": 2.5, "fwd+bwd": 3.5}


def flops(b, h, n, d, causal, pass_="forward"):
    f = 4.0 * b * h * n * n * d * PASS_FLOPS[pass_]
    return f / 2 if causal else f


def pass_of(row):
    """The row's pass; rows of files written before the column existed are forward rows."""
    return row.get("pass") or "forward"


def sm_clock_mhz():
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # no NVML here: the column says -1
        return -1


def causal_values(mode):
    return [c for c in (False, True) if mode == "both" or (mode == "yes") == c]


# ----------------------------------------------------------------------------- our executables
def read_ceiling(path):
    """The JSON lines of mma_ceiling, as {name: record}."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out[r["name"]] = r
    return out


def run_mma_ceiling(args):
    """The mma.sync bf16 rate in TFLOP/s (and every ceiling measured), or (None, {})."""
    if args.mma_ceiling_tflops is not None:
        return args.mma_ceiling_tflops, {}
    path = args.mma_ceiling_json
    if path is None:
        exe = args.mma_ceiling_exe or os.path.join(os.path.dirname(os.path.abspath(args.bench_exe)), "mma_ceiling")
        if not os.path.exists(exe):
            print(f"no mma_ceiling at {exe}: the stage 07 figures go without their fraction of the ceiling", flush=True)
            return None, {}
        path = os.path.join(args.out_dir, "mma_ceiling.jsonl")
        cmd = [exe, "--json", path]
        print("running", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print("mma_ceiling failed: the stage 07 figures go without their fraction of the ceiling", flush=True)
            return None, {}
    ceilings = read_ceiling(path)
    bf16 = ceilings.get("mma_bf16", {}).get("value")
    return bf16, ceilings


def run_wgmma_ceiling(args):
    """The dense wgmma bf16 rate (A and B in shared memory, as S = Q K^T reads them) in TFLOP/s, or None."""
    if args.wgmma_ceiling_tflops is not None:
        return args.wgmma_ceiling_tflops
    path = args.wgmma_ceiling_json
    if path is None:
        exe = os.path.join(os.path.dirname(os.path.abspath(args.bench_exe)), "wgmma_ceiling")
        if not os.path.exists(exe):
            print(f"no wgmma_ceiling at {exe}: the stage 11 figures go without their fraction of the ceiling", flush=True)
            return None
        path = os.path.join(args.out_dir, "wgmma_ceiling.jsonl")
        cmd = [exe, "--json", path]
        print("running", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:  # 77 on a GPU without wgmma
            print("wgmma_ceiling did not run: the stage 11 figures go without their fraction of the ceiling", flush=True)
            return None
    return read_ceiling(path).get("wgmma_ss_bf16", {}).get("value")


def bench_stages(stages):
    """bench_gpu's --stages for ours: stage 10's points run with stage 09 (its backward after stage 07's forward).

    >>> bench_stages(["10"]), bench_stages(["07", "10"])
    (['09'], ['07', '09'])
    """
    return sorted({s for s in stages if s != "10"} | ({"09"} if "10" in stages else set()))


def run_bench_gpu(args, ceiling, out_json, out_csv, wgmma=None):
    """Runs bench_gpu; returns its JSON and whether every point passed its check."""
    cmd = [args.bench_exe, "--stages", *bench_stages(args.stages), "--sizes", *map(str, args.sizes), "--head-dims",
           *map(str, args.head_dims), "--causal", args.causal, "--tokens", str(args.tokens), "--width", str(args.width),
           "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--json", out_json, "--csv", out_csv]
    if any(s in HALF_STAGES + ("10",) for s in args.stages):
        cmd += ["--dtypes", *args.dtypes]
    if "10" in args.stages:
        cmd += [x for spec in args.model07 for x in ("--model07", spec)]
        if args.varlen07:
            cmd += ["--varlen07", ",".join(map(str, args.varlen07))]
    if "07" in args.stages:
        if args.steps:
            cmd += ["--steps", *args.steps]
        if ceiling:
            cmd += ["--mma-ceiling-tflops", f"{ceiling:.1f}"]
    if "09" in args.stages and args.steps09:
        cmd += ["--steps09", *map(str, args.steps09)]
        if args.steps09_backward_only:
            cmd += ["--steps09-backward-only"]
    if "11" in args.stages:
        if args.steps11:
            cmd += ["--steps11", *args.steps11]
        if wgmma:
            cmd += ["--wgmma-ceiling-tflops", f"{wgmma:.1f}"]
    if not args.check:
        cmd += ["--check", "false"]
    print("running", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd).returncode
    if rc not in (0, 1):  # 1: a point failed its check, and the files were written
        sys.exit(f"bench_gpu failed with exit code {rc}")
    with open(out_json) as f:
        return json.load(f), rc == 0


# ----------------------------------------------------------------------------- PyTorch SDPA
def time_torch(fn, warmup, repeat, flush):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for i in range(repeat):
        flush.fill_(i & 0xFF)  # evict the inputs the previous run left in L2
        starts[i].record()
        fn()
        stops[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2]), times[0], times[-1]


def sdpa_plan(args):
    """(backend, dtype) pairs to time forward: what the stages in this run are compared with."""
    plan = []
    if not any(s in FP32_STAGES + HALF_STAGES for s in args.stages):
        return plan  # stage 10 alone: its own points (run_sdpa_stage10)
    if any(s in FP32_STAGES for s in args.stages):
        plan += [("flash", "fp32"), ("cudnn", "fp32"), ("efficient", "fp32"), ("math", "fp32")]
    half = args.dtypes if any(s in HALF_STAGES for s in args.stages) else ["bf16"]
    plan += [(name, t) for t in half for name in ("flash", "cudnn")]
    return plan


def sdpa_backward_plan(args):
    """(backend, dtype) pairs to time backward and forward + backward: beside stage 09."""
    return [(name, t) for t in args.dtypes for name in ("flash", "cudnn")] if "09" in args.stages else []


def sdpa_backends():
    """SDPA's backends by the names the course gives them (flash, cudnn, efficient, math)."""
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def sdpa_setup():
    """What every SDPA run needs: the backends and dtypes by name, and the buffer whose overwrite
    flushes the L2 (four times its size) before each timed run."""
    import torch

    # A backend pinned to a dtype it lacks warns before it raises; the raise is recorded.
    warnings.filterwarnings("ignore", message=".*(kernel not used|runtime disabled|Expected query, key).*")
    torch.manual_seed(1234)
    backends = sdpa_backends()
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    torch.backends.cuda.matmul.allow_tf32 = False  # the math backend in true float32
    torch.backends.cudnn.allow_tf32 = False
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    return backends, dtypes, torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device="cuda")


def run_sdpa(args, gpu_name, date):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    backends, dtypes, flush = sdpa_setup()
    plan, backward_plan = sdpa_plan(args), sdpa_backward_plan(args)
    print("SDPA backends: " + ", ".join(f"{b} {t}" for b, t in plan)
          + ("; backward: " + ", ".join(f"{b} {t}" for b, t in backward_plan) if backward_plan else ""), flush=True)
    rows = []
    total = len(args.head_dims) * len(args.sizes) * len(causal_values(args.causal))
    done = 0
    for d in args.head_dims:
        for n in args.sizes:
            b, h = max(1, args.tokens // n), max(1, args.width // d)
            gen = torch.Generator(device="cuda").manual_seed(1234)
            q32, k32, v32, do32 = (torch.randn(b, h, n, d, device="cuda", generator=gen) for _ in range(4))
            for causal in causal_values(args.causal):
                done += 1
                point = []
                for name, dtype_name in plan:
                    row = dict(impl="sdpa_" + name, dtype=dtype_name, B=b, H=h, N=n, d=d, causal=int(causal), gpu=gpu_name,
                               date=date, **{"pass": "forward"})
                    if name == "math":
                        # N x N scores and probabilities per head, in float32, several copies.
                        need = 4.0 * b * h * n * n * 3
                        free, _ = torch.cuda.mem_get_info()
                        if need > 0.6 * free:
                            rows.append(dict(row, note="skipped: N x N matrices too large"))
                            continue
                    q, k, v = (t.to(dtypes[dtype_name]) for t in (q32, k32, v32))
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
                    try:
                        with sdpa_kernel(backends[name]):
                            ms, lo, hi = time_torch(fn, args.warmup, args.repeat, flush)
                        row.update(median_ms=ms, min_ms=lo, max_ms=hi, tflops=flops(b, h, n, d, causal) / (ms * 1e-3) * 1e-12,
                                   sm_clock_mhz=sm_clock_mhz())
                        point.append(f"{name}/{dtype_name}={row['tflops']:.1f}")
                    except (RuntimeError, torch.OutOfMemoryError) as e:  # no kernel for this dtype/shape
                        row.update(note="unsupported: " + first_line(e))
                        if dtype_name != "fp32":  # fp32 flash/cudnn are expected to refuse; a 16-bit refusal is news
                            point.append(f"{name}/{dtype_name}=unsupported")
                    rows.append(row)
                    del q, k, v
                for name, dtype_name in backward_plan:
                    base = dict(impl="sdpa_" + name, dtype=dtype_name, B=b, H=h, N=n, d=d, causal=int(causal), gpu=gpu_name,
                                date=date)
                    for pass_, row in time_sdpa_backward(args, backends[name], dtypes[dtype_name], q32, k32, v32, do32,
                                                         causal, flush):
                        if row.get("median_ms") is not None:
                            row["tflops"] = flops(b, h, n, d, causal, pass_) / (row["median_ms"] * 1e-3) * 1e-12
                            point.append(f"{name}/{dtype_name}/{'bwd' if pass_ == 'backward' else pass_}={row['tflops']:.1f}")
                        else:
                            point.append(f"{name}/{dtype_name}/{pass_}=unsupported")
                        rows.append(dict(base, **row, **{"pass": pass_}))
                print(f"[{done:2d}/{total}] sdpa d={d} N={n} {'causal' if causal else 'non-causal'}: {' '.join(point)} TFLOP/s",
                      flush=True)
            del q32, k32, v32, do32
            torch.cuda.empty_cache()
    return rows


def time_sdpa_backward(args, backend, dtype, q32, k32, v32, do32, causal, flush):
    """SDPA pinned to `backend` in `dtype`: the backward alone, then forward + backward as one pair.
    Yields (pass, fields): median_ms, min_ms, max_ms, sm_clock_mhz, or the refusal in the note."""
    import torch
    import torch.nn.functional as F

    q, k, v = (t.to(dtype).requires_grad_() for t in (q32, k32, v32))
    # dO with o's own strides: a backend may copy a dO laid out otherwise before its kernel.
    yield from time_sdpa_passes(args, backend, (q, k, v), lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                lambda o: torch.empty_like(o).copy_(do32), flush)


def time_sdpa_passes(args, backend, leaves, attend, make_do, flush, passes=("backward", "fwd+bwd")):
    """SDPA pinned to `backend`: attend() -> o, a call of scaled_dot_product_attention on the
    tensors `leaves` (which require grad), in each of `passes`: "forward" (under no_grad), "backward"
    (torch.autograd.grad(o, leaves, dO, retain_graph=True) after one forward) and "fwd+bwd" (the two
    as one pair); make_do(o) gives dO. Yields (pass, fields): median_ms, min_ms, max_ms,
    sm_clock_mhz, or the refusal in the note (refusal_note())."""
    import torch
    from torch.nn.attention import sdpa_kernel

    def timed(fn):
        note = refusal_note(fn)  # one untimed run, which also says why a backend refuses
        if note:
            return dict(note=note)
        try:
            ms, lo, hi = time_torch(fn, args.warmup, args.repeat, flush)
        except REFUSALS + (torch.OutOfMemoryError,) as e:
            return dict(note="unsupported: " + first_line(e))
        return dict(median_ms=ms, min_ms=lo, max_ms=hi, sm_clock_mhz=sm_clock_mhz())

    later = [p for p in passes if p != "forward"]
    with sdpa_kernel(backend):
        if "forward" in passes:
            fields = timed(attend_no_grad(attend))
            yield "forward", fields
            if "note" in fields:  # no forward kernel: no backward either
                for pass_ in later:
                    yield pass_, fields
                return
        graph = {}

        def first_forward():
            graph["o"] = attend()
            graph["do"] = make_do(graph["o"])

        note = refusal_note(first_forward) if later else None
        if note:
            for pass_ in later:
                yield pass_, dict(note=note)
            return
        o, do = graph.pop("o", None), graph.pop("do", None)

        def backward():
            torch.autograd.grad(o, leaves, do, retain_graph=True)

        def forward_backward():
            torch.autograd.grad(attend(), leaves, do)

        for pass_, fn in (("backward", backward), ("fwd+bwd", forward_backward)):
            if pass_ in passes:
                yield pass_, timed(fn)
        del o, do


# What SDPA raises when it has no kernel for a call (torch.OutOfMemoryError is added where torch is
# imported): RuntimeError above all ("No available kernel"); the nested tensors' checks raise the others.
REFUSALS = (RuntimeError, ValueError, TypeError, AssertionError)


def refusal_note(fn):
    """Runs fn() once: None when it ran; when a backend refused, "unsupported: " and the error's
    first line, with the reasons SDPA warned of before raising (why each backend was not used)."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
            return None
        except REFUSALS + (torch.OutOfMemoryError,) as e:
            why = []
            for w in caught:
                line = first_line(w.message)
                if line not in why and "not used because" not in line:
                    why.append(line)
            return "unsupported: " + first_line(e) + (" (" + "; ".join(why[:3]) + ")" if why else "")


def attend_no_grad(attend):
    """attend() run without recording the graph: a forward as inference runs it."""
    import torch

    def run():
        with torch.no_grad():
            return attend()
    return run


def first_line(e):
    """The first line of an exception's message (120 characters at most), or its type's name."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:120]


# ----------------------------------------------------------------------------- files
# Every table this run prints, cell by cell (bench/records.py): written to tables.json at the end,
# and each file that tee_to_file() writes gets the tables it shows beside it as JSON. Nothing reads
# the printed text back.
PRINTED = records.Run()
_TEED = []  # the tables of each file being written by tee_to_file(), innermost last


def emit(table):
    """Keeps a printed table's cells for tables.json and the file being written."""
    PRINTED.tables.append(table)
    for tables in _TEED:
        tables.append(table)


def show(table, rows=None):
    """Prints a table (its title, its heads, its rows: all, or those given) and keeps its cells."""
    print(table.meta["title"])
    print(table.head_line())
    for r in table.rows if rows is None else rows:
        print(table.row_line(r))
    emit(table)


def tee_to_file(path, fn, *args):
    """Runs fn(*args), prints what it printed and keeps a copy in `path` (the table a lesson shows),
    and the cells of the tables it printed in the JSON file beside it (X.txt: X.json)."""
    buf, tables = io.StringIO(), []
    _TEED.append(tables)
    try:
        with contextlib.redirect_stdout(buf):
            fn(*args)
    finally:
        _TEED.pop()
    sys.stdout.write(buf.getvalue())
    with open(path, "w") as f:
        f.write(buf.getvalue().lstrip("\n"))
    if tables:
        records.write_tables(os.path.splitext(path)[0] + ".json", records.Run(dict(PRINTED.meta), tables))


def worst_table(kind, title, found, over_rounds=False):
    """The lowest ratio of each kind compared (found: label -> (ratio[, lo, hi], dtype, d, N, causal))
    as a table of its own, for the worst lines the tables end with."""
    cols = [Column("what", "what", 0, "s"), Column("value", "value", 0, ".2f")]
    cols += [Column("lo", "lo", 0, ".2f"), Column("hi", "hi", 0, ".2f")] if over_rounds else []
    cols += [Column("dtype", "dtype", 0, "s"), Column("d", "d", 0, "d"), Column("N", "N", 0, "d"),
             Column("causal", "causal", 0, "bool")]
    t = Table(kind, cols, {"title": title})
    for label, cells in found.items():
        t.add(label, *cells[:-1], bool(cells[-1]))
    emit(t)
    return t


def where(t, d, n, c):
    """'(bf16, d=64, N=4096, causal)': where a worst ratio was."""
    return f"({t}, d={d}, N={n}, {'causal' if c else 'non-causal'})"


def write_csv(path, rows, columns):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({c: ("%.6g" % r[c] if isinstance(r.get(c), float) else r.get(c, "")) for c in columns})


def write_road(args, meta, name, rows, columns, table, printer):
    """A road's rows as NAME.csv and NAME.json (with the run's metadata) in --out-dir, and its
    table, printed and kept in TABLE."""
    write_csv(os.path.join(args.out_dir, name + ".csv"), rows, columns)
    with open(os.path.join(args.out_dir, name + ".json"), "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    tee_to_file(os.path.join(args.out_dir, table), printer, args, rows)
    print(f"wrote {os.path.join(args.out_dir, name + '.csv')}")


def merge_rows(rows, path):
    """Rows of an earlier sweep (CSV) whose (impl, dtype, pass) this run did not measure, so one
    file keeps every stage: e.g. stage 07's sweep beside the float32 stages measured before. Rows
    of a file without the pass column are forward rows, and say so in the new file."""
    measured = {(r["impl"], r["dtype"], pass_of(r)) for r in rows}
    with open(path, newline="") as f:
        old = [dict(r, **{"pass": pass_of(r)}) for r in csv.DictReader(f)]
    old = [r for r in old if (r["impl"], r["dtype"], r["pass"]) not in measured]
    kept = sorted({r["impl"] + " " + r["dtype"] + ("" if r["pass"] == "forward" else " " + r["pass"]) for r in old})
    print(f"kept {len(old)} rows of {path} ({', '.join(kept) or 'none'})", flush=True)
    return rows + old


# ----------------------------------------------------------------------------- tables
def index(rows, pass_="forward"):
    """(impl, dtype, N, d, causal) -> row, for the rows of one pass that have a time."""
    return {(r["impl"], r["dtype"], int(r["N"]), int(r["d"]), int(r["causal"])): r for r in rows
            if r.get("tflops") not in (None, "") and pass_of(r) == pass_}


def rotated(items, k):
    """`items` turned left by k places (a list; k taken modulo its length).

    >>> rotated(["8/-1/0", "4/-1/0", "1/4095/0"], 1)
    ['4/-1/0', '1/4095/0', '8/-1/0']
    >>> rotated(["bf16", "fp16"], 3), rotated([], 2)
    (['fp16', 'bf16'], [])
    """
    items = list(items)
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def round_order(args, rnd):
    """The arguments of round `rnd` (from 0): its dtypes, sizes, head dimensions and --model07
    points turned by `rnd` places. The GPU lowers its clock for short spells under sustained load
    (power management); in a fixed order such a spell falls on the same points every round, and
    the median over the rounds keeps it. Turned, it falls on other points in other rounds. Round
    0 keeps the given order (median_rows() lists the points in the first round's).

    >>> a = round_order(argparse.Namespace(dtypes=["bf16", "fp16"], sizes=[1024, 4096, 16384], head_dims=[64, 128],
    ...                                    model07=["8/-1/0", "4/-1/0"], rounds=3), 1)
    >>> a.dtypes, a.sizes, a.head_dims, a.model07
    (['fp16', 'bf16'], [4096, 16384, 1024], [128, 64], ['4/-1/0', '8/-1/0'])
    """
    turned = argparse.Namespace(**vars(args))
    for name in ("dtypes", "sizes", "head_dims", "model07"):
        setattr(turned, name, rotated(getattr(args, name), rnd))
    return turned


def median_rows(rounds):
    """One row per point from several rounds' lists of rows: the row whose median_ms is the median
    of the rounds' (the lower middle one for an even count); a point no round timed keeps its first
    row (with its note). The order is the first round's."""
    def key(r):
        return (r["impl"], r["dtype"], int(r["B"]), int(r["H"]), int(r["N"]), int(r["d"]), int(r["causal"]), pass_of(r))

    by_key = {}
    for rows in rounds:
        for r in rows:
            by_key.setdefault(key(r), []).append(r)
    out, seen = [], set()
    for rows in rounds:
        for r in rows:
            k = key(r)
            if k in seen:
                continue
            seen.add(k)
            timed = sorted((x for x in by_key[k] if x.get("median_ms") not in (None, "")), key=lambda x: float(x["median_ms"]))
            out.append(timed[(len(timed) - 1) // 2] if timed else by_key[k][0])
    return out


def round_ratio(round_idx, a, b, key, of=None):
    """(median, min, max, rounds) of a / b over the rounds in which both were timed, or None: by
    TFLOP/s (ratio()), or by `of` (row a, row b) -> number or None."""
    of = of or ratio
    xs = sorted(x for x in (of(i.get((a, *key)), i.get((b, *key))) for i in round_idx) if x is not None)
    if not xs:
        return None
    n = len(xs)
    med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    return med, xs[0], xs[-1], n


def print_round_ratios(args, round_rows, gpu_name, date):
    """Per point and dtype, each ratio the targets name as its median over the rounds with min and
    max (each ratio taken between the two timings of one round); then the worst median. Stage 09's
    ratios are of the forward + backward pair and of the backward alone, for the default main kernel
    and for each other one timed (--steps09: rows stage09_step<i>; a step timed without its pair,
    --steps09-backward-only, has the backward's ratio alone). Stage 11's default is also held against
    each other step of its road timed beside it (--steps11: rows stage11_step<i>, 11/11s<i>). One
    table of kind "ratios" holds every ratio; it is printed six ratios at a time."""
    # (what is compared, its pass, the rows of each round indexed for that pass)
    by_pass = {p: [index(r, p) for r in round_rows] for p in ("forward", "fwd+bwd", "backward")}
    pairs = []
    if "07" in args.stages:
        pairs += [("stage07", "sdpa_flash", "forward"), ("stage07", "sdpa_cudnn", "forward")]
    if "11" in args.stages:
        pairs += [("stage11", "sdpa_cudnn", "forward"), ("stage11", "sdpa_flash", "forward"), ("stage11", "stage07", "forward")]
        # the default step over each other step of the road timed beside it (--steps11; step 0 is stage 07's)
        steps11 = {k[0] for i in by_pass["forward"] for k in i if k[0].startswith("stage11_step") and k[0] != "stage11_step0"}
        pairs += [("stage11", impl, "forward") for impl in sorted(steps11, key=lambda x: int(x[len("stage11_step"):]))]
    if "09" in args.stages:
        # each step's rows of each pass (--steps09-backward-only: no fwd+bwd rows, and no pair's ratio)
        steps09 = {p: {k[0] for i in by_pass[p] for k in i
                       if k[0].startswith("stage09_step") and not k[0].endswith("_deterministic")}
                   for p in ("fwd+bwd", "backward")}
        pairs += [("stage09", "sdpa_flash", "fwd+bwd"), ("stage09", "sdpa_cudnn", "fwd+bwd"), ("stage09", "sdpa_flash", "backward")]
        for impl in sorted(steps09["fwd+bwd"] | steps09["backward"]):
            pairs += [(impl, "sdpa_flash", p) for p in ("fwd+bwd", "backward") if impl in steps09[p]]
    short = {"stage07": "07", "stage11": "11", "stage09": "09", "sdpa_flash": "flash", "sdpa_cudnn": "cudnn"}
    tag = {"forward": "", "fwd+bwd": " f+b", "backward": " bwd"}

    def name(a, b, p):
        return short.get(a, a.replace("stage09_step", "09s")) + "/" + short.get(b, b.replace("stage11_step", "11s")) + tag[p]

    title = (f"{gpu_name}, {date}: ratios over {len(round_rows)} rounds (ours, then SDPA, in each round): median [min, max]"
             + ("; 09s<i>: stage 09's main kernel of step i, f+b: stage 07's forward + the backward, bwd: the backward"
                if "09" in args.stages else ""))
    table = Table("ratios", records.RATIO_POINT + [records.ratio_column(*x, name(*x)) for x in pairs],
                  {"title": title, "rounds": len(round_rows)})
    worst = {}
    for t in args.dtypes:
        for d in args.head_dims:
            for n in args.sizes:
                for c in causal_values(args.causal):
                    cells = []
                    for a, b, p in pairs:
                        st = round_ratio(by_pass[p], a, b, (t, n, d, int(c)))
                        if st is None and b == "stage07":  # stage 07 not timed: step 0 of stage 11's road is its kernel
                            st = round_ratio(by_pass[p], a, "stage11_step0", (t, n, d, int(c)))
                        cells.append(None if st is None else list(st[:3]))
                        if st is not None and ((a, b, p) not in worst or st[0] < worst[(a, b, p)][0]):
                            worst[(a, b, p)] = (st[0], st[1], st[2], t, d, n, c)
                    if any(x is not None for x in cells):
                        table.add(t, d, n, c, *cells)
    print()
    print(title)
    point = len(records.RATIO_POINT)
    for chunk in range(0, len(pairs), 6):  # at most six ratios per printed table, so that a line stays readable
        cols = list(range(point)) + list(range(point + chunk, point + min(chunk + 6, len(pairs))))
        part = Table("ratios", [table.columns[i] for i in cols])
        print(part.head_line())
        for r in table.rows:
            if any(r[i] is not None for i in cols[point:]):
                print(part.row_line([r[i] for i in cols]))
        print()
    emit(table)
    labels = {(a, b, p): f"{a} / {b}{' (' + p + ')' if p != 'forward' else ''}" for a, b, p in worst}
    found = worst_table("worst_over_rounds", "worst median ratio over rounds",
                        {labels[k]: v for k, v in worst.items()}, over_rounds=True)
    for label, med, lo, hi, t, d, n, c in found.rows:
        print(f"worst median {label} ratio over rounds: {med:.2f} [{lo:.2f}, {hi:.2f}] {where(t, d, n, c)}")


def fmt(r, key="tflops", digits=1):
    return f"{float(r[key]):.{digits}f}" if r else "-"


def value(r, key="tflops"):
    """A row's number (its rate by default) for a table's cell; None without the row."""
    return float(r[key]) if r else None


def ratio(a, b):
    return float(a["tflops"]) / float(b["tflops"]) if a and b and float(b["tflops"]) > 0 else None


def rfmt(x, digits=2, suffix=""):
    return f"{x:.{digits}f}{suffix}" if x is not None else "-"


def is_bad(*rows):
    """Whether a row of the point failed its check (its table row ends in BAD)."""
    return any(r and r.get("check") == "BAD" for r in rows)


FP32_COLUMNS = records.POINT + [
    Column("stage05", "stage05", 8), Column("stage06", "stage06", 8), Column("sdpa_efficient", "sdpa_eff", 9),
    Column("vs_eff05", "05/eff", 7, ".2f"), Column("vs_eff06", "06/eff", 7, ".2f")]


def print_fp32_table(args, idx, gpu_name, date):
    half = "bf16"
    table = Table("fp32", FP32_COLUMNS + [Column("flash_half", "flash " + half, 11), Column("cudnn_half", "cudnn " + half, 11)],
                  {"title": f"{gpu_name}, {date}: TFLOP/s in float32 (ratio = ours / SDPA efficient fp32; target >= 0.50)",
                   "half": half})
    worst = None
    for d in args.head_dims:
        for n in args.sizes:
            for c in causal_values(args.causal):
                s5, s6, eff = (idx.get((i, "fp32", n, d, int(c))) for i in ("stage05", "stage06", "sdpa_efficient"))
                fl, cu = idx.get(("sdpa_flash", half, n, d, int(c))), idx.get(("sdpa_cudnn", half, n, d, int(c)))
                r5, r6 = ratio(s5, eff), ratio(s6, eff)
                if r6 is not None:
                    worst = r6 if worst is None else min(worst, r6)
                table.add(d, n, c, value(s5), value(s6), value(eff), r5, r6, value(fl), value(cu))
    print()
    show(table)
    share = Table("causal_share", records.POINT[:2] + [Column("causal_over_full", "causal/full", 0, ".3f")],
                  {"title": "stage 06 causal / non-causal time (target <= 0.55 at N >= 4096):"})
    for d in args.head_dims:
        for n in args.sizes:
            nc, c = idx.get(("stage06", "fp32", n, d, 0)), idx.get(("stage06", "fp32", n, d, 1))
            if nc and c:
                share.add(d, n, float(c["median_ms"]) / float(nc["median_ms"]))
    print()
    print(share.meta["title"])
    for d, n, x in share.rows:
        print(f"  d={d:<4} N={n:<6} {x:.3f}")
    emit(share)
    if worst is not None:
        emit(Table("worst", [Column("what", "what", 0, "s"), Column("value", "value", 0, ".2f")],
                   {"title": "worst stage06 / sdpa_efficient fp32 ratio"}, [["stage06 / sdpa_efficient", worst]]))
        print(f"\nworst stage06 / sdpa_efficient fp32 ratio: {worst:.2f}")


STAGE07_COLUMNS = records.POINT + [
    Column("stage07", "stage07", 8), Column("flash", "flash", 8), Column("cudnn", "cudnn", 8),
    Column("vs_flash", "07/flash", 9, ".2f"), Column("vs_cudnn", "07/cudnn", 9, ".2f"),
    Column("pct_of_mma", "% of mma", 9, ".1f%"), Column("bad", "BAD", 0, "flag")]


def print_stage07_tables(args, idx, rows, ceiling, gpu_name, date):
    """Stage 07's final kernel against SDPA flash and cuDNN, one table per dtype; returns the worst 07/flash."""
    worst = None
    for t in args.dtypes:
        table = Table("stage07", STAGE07_COLUMNS, {
            "title": f"{gpu_name}, {date}: stage 07 in {t}, TFLOP/s (target: 07 / flash >= 1.0, aim 1.2)"
                     + (f"; mma.sync bf16 ceiling {ceiling:.0f} TFLOP/s" if ceiling else ""),
            "dtype": t, "ceiling": ceiling})
        for d in args.head_dims:
            for n in args.sizes:
                for c in causal_values(args.causal):
                    s7 = idx.get(("stage07", t, n, d, int(c)))
                    fl, cu = idx.get(("sdpa_flash", t, n, d, int(c))), idx.get(("sdpa_cudnn", t, n, d, int(c)))
                    rf, rc = ratio(s7, fl), ratio(s7, cu)
                    if rf is not None and (worst is None or rf < worst[0]):
                        worst = (rf, t, d, n, c)
                    pct = 100 * float(s7["tflops"]) / ceiling if s7 and ceiling else None
                    table.add(d, n, c, value(s7), value(fl), value(cu), rf, rc, pct, is_bad(s7))
        print()
        show(table)
        print_refused(rows, t)
    if worst:
        found = worst_table("worst", "worst stage07 / sdpa_flash ratio", {"stage07 / sdpa_flash": worst})
        for label, x, t, d, n, c in found.rows:
            print(f"\nworst {label} ratio: {x:.2f} {where(t, d, n, c)}")


REFUSED_COLUMNS = [Column("impl", "impl", 0, "s"), Column("dtype", "dtype", 0, "s"), Column("pass", "pass", 0, "s"),
                   Column("d", "d", 0, "d"), Column("N", "N", 0, "d"), Column("causal", "causal", 0, "bool"),
                   Column("note", "note", 0, "s")]


def print_refused(rows, dtype, forward=True):
    """The shapes of `dtype` that SDPA's flash or cuDNN backend refused, with its reason: of the
    forward (forward=True), else of the backward and the pair."""
    refused = sorted({(r["impl"], pass_of(r), r["N"], r["d"], r["causal"], r["note"]) for r in rows
                      if r["impl"] in ("sdpa_flash", "sdpa_cudnn") and r["dtype"] == dtype
                      and (pass_of(r) == "forward") == forward and r.get("note")})
    table = Table("refused", REFUSED_COLUMNS, {"title": "what SDPA refused", "dtype": dtype})
    for impl, pass_, n, d, c, note in refused:
        table.add(impl, dtype, pass_, int(d), int(n), bool(int(c)), note)
        print(f"  {impl} {dtype}{'' if forward else ' ' + pass_} d={d} N={n} {'causal' if c else 'non-causal'}: {note}")
    if table.rows:
        emit(table)


def print_stage09_tables(args, rows, gpu_name, date):
    """Stage 07's forward + stage 09's backward against SDPA flash and cuDNN forward + backward,
    one table per dtype, with the backward alone and the deterministic backward beside it."""
    fwd_bwd, bwd = index(rows, "fwd+bwd"), index(rows, "backward")
    worst = {}  # what is compared -> (ratio, dtype, d, N, causal), the lowest ratio seen

    def keep_worst(label, x, at):
        if x is not None and (label not in worst or x < worst[label][0]):
            worst[label] = (x, *at)

    for t in args.dtypes:
        table = Table("stage09_pair", records.STAGE09_PAIR, {
            "title": f"{gpu_name}, {date}: stage 07 forward + stage 09 backward in {t}, TFLOP/s (fwd+bwd timed as one pair; "
                     "the backward alone; det: deterministic dQ)", "dtype": t})
        for d in args.head_dims:
            for n in args.sizes:
                for c in causal_values(args.causal):
                    key = (t, n, d, int(c))
                    ours, fl, cu = (fwd_bwd.get((i, *key)) for i in ("stage09", "sdpa_flash", "sdpa_cudnn"))
                    ours_b, fl_b, cu_b = (bwd.get((i, *key)) for i in ("stage09", "sdpa_flash", "sdpa_cudnn"))
                    det = bwd.get(("stage09_deterministic", *key))
                    rf, rc, rbf, rbc = ratio(ours, fl), ratio(ours, cu), ratio(ours_b, fl_b), ratio(ours_b, cu_b)
                    for label, x in (("fwd+bwd / sdpa_flash", rf), ("fwd+bwd / sdpa_cudnn", rc),
                                     ("backward / sdpa_flash", rbf), ("backward / sdpa_cudnn", rbc)):
                        keep_worst(label, x, (t, d, n, c))
                    slower = float(det["median_ms"]) / float(ours_b["median_ms"]) if det and ours_b else None
                    table.add(d, n, c, value(ours), value(fl), value(cu), rf, rc, value(ours_b), rbf, rbc,
                              value(ours_b, "median_ms"), value(det, "median_ms"), slower, is_bad(ours_b, det))
        print()
        show(table)
        print_refused(rows, t, forward=False)
    if worst:
        print()
        found = worst_table("worst", "worst stage 07 + 09 ratio", worst)
        for label, x, t, d, n, c in found.rows:
            print(f"worst stage 07 + 09 {label} ratio: {x:.2f} {where(t, d, n, c)}")
    print_stage09_step_tables(args, fwd_bwd, bwd)


def print_stage09_step_tables(args, fwd_bwd, bwd):
    """Other main kernels of stage 09 (bench_gpu --steps09: rows stage09_step<i>) beside the default
    one and SDPA flash, one table per step and dtype. A step timed by its backward alone (bench_gpu
    --steps09-backward-only: no fwd+bwd row, no deterministic row) keeps every column, "-" where
    its row is missing (null in its table's cells)."""
    steps = sorted({k[0] for k in list(fwd_bwd) + list(bwd)
                    if k[0].startswith("stage09_step") and not k[0].endswith("_deterministic")})
    for impl in steps:
        for t in args.dtypes:
            if not any(k[:2] == (impl, t) for k in list(fwd_bwd) + list(bwd)):
                continue  # not timed in this dtype: no table
            backward_only = not any(k[:2] == (impl, t) for k in fwd_bwd) and not any(
                k[:2] == (impl + "_deterministic", t) for k in bwd)
            table = Table("stage09_step", records.STAGE09_STEP, {
                "title": f"{impl} in {t} beside the default main kernel (stage09) and SDPA flash, TFLOP/s; "
                         + ("its backward alone, with atomic dQ (no pair, no deterministic backward timed)" if backward_only
                            else "its backward's time with atomic and deterministic dQ"),
                "dtype": t, "impl": impl, "step": int(impl[len("stage09_step"):]), "backward_only": backward_only})
            for d in args.head_dims:
                for n in args.sizes:
                    for c in causal_values(args.causal):
                        key = (t, n, d, int(c))
                        mine, base, fl = (fwd_bwd.get((i, *key)) for i in (impl, "stage09", "sdpa_flash"))
                        mine_b, base_b, fl_b = (bwd.get((i, *key)) for i in (impl, "stage09", "sdpa_flash"))
                        if mine is None and mine_b is None:
                            continue
                        det = bwd.get((impl + "_deterministic", *key))
                        slower = float(det["median_ms"]) / float(mine_b["median_ms"]) if det and mine_b else None
                        table.add(d, n, c, value(mine), ratio(mine, base), ratio(mine, fl), value(mine_b), ratio(mine_b, base_b),
                                  ratio(mine_b, fl_b), value(mine_b, "median_ms"), value(det, "median_ms"), slower,
                                  is_bad(mine_b))
            print()
            show(table)


def road_rows(args, bench, idx, ceiling):
    """One row per stage 07 step and shape, with its gain; and SDPA flash at each shape."""
    road = {s["step"]: s for s in bench.get("stage07_road", [])}
    final = bench.get("stage07_final_step")
    by_step = {}
    for r in bench["results"]:
        if r.get("step") is not None and r["dtype"] in args.dtypes and not r["impl"].startswith("stage11"):
            by_step[(r["step"], r["dtype"], r["N"], r["d"], int(r["causal"]))] = r
    out = []
    shapes = sorted({k[1:] for k in by_step}, key=lambda k: (k[0] != "bf16", k[0], k[2], k[1], k[3]))
    for t, n, d, c in shapes:
        flash = idx.get(("sdpa_flash", t, n, d, c))
        for step in sorted({k[0] for k in by_step if k[1:] == (t, n, d, c)}):
            r = by_step[(step, t, n, d, c)]
            # Road steps build on the step before; a tuning candidate is a variant of the final kernel.
            over = step - 1 if final is None or step <= final else final
            prev = by_step.get((over, t, n, d, c))
            out.append(dict(kind="road" if final is None or step <= final else "candidate", impl=r["impl"], step=step, step_name=r.get("step_name", ""), idea=road.get(step, {}).get("idea", ""),
                            dtype=t, d=d, N=n, causal=c, tflops=r["tflops"], median_ms=r["median_ms"],
                            gain=ratio(r, prev) if prev else "", gain_over=over if prev else "",
                            vs_flash=ratio(r, flash) if flash else "",
                            pct_of_mma=100 * r["tflops"] / ceiling if ceiling else "", gpu=bench["gpu"],
                            sm_clock_mhz=r["sm_clock_mhz"], date=bench["date"]))
        if flash:
            out.append(dict(kind="sdpa", impl="sdpa_flash", step="", step_name="SDPA flash", idea="PyTorch SDPA, flash backend", dtype=t,
                            d=d, N=n, causal=c, tflops=flash["tflops"], median_ms=flash["median_ms"], gain="", gain_over="",
                            vs_flash=1.0, pct_of_mma=100 * flash["tflops"] / ceiling if ceiling else "", gpu=flash["gpu"],
                            sm_clock_mhz=flash["sm_clock_mhz"], date=flash["date"]))
    return out


def print_road(args, rows):
    """The road in bf16 (or the first dtype timed) at one N: a row per step, a column per (d, causal);
    then the slower steps at any N, and which tile shape was fastest where candidates were timed."""
    dtype = "bf16" if any(r["dtype"] == "bf16" for r in rows) else rows[0]["dtype"]
    rows = [r for r in rows if r["dtype"] == dtype]
    sizes = sorted({r["N"] for r in rows})
    n = args.road_n if args.road_n in sizes else sizes[len(sizes) // 2]
    cols = sorted({(r["d"], r["causal"]) for r in rows if r["N"] == n})
    cell = {(r["kind"], r["step"], r["d"], r["causal"]): r for r in rows if r["N"] == n}
    heads = ["d=%d %s" % (d, "causal" if c else "full") for d, c in cols]

    def line(kind, step, name):
        cells = []
        for d, c in cols:
            r = cell.get((kind, step, d, c))
            text = "-" if r is None else "%.1f" % r["tflops"] + (" x%.2f" % r["gain"] if r["gain"] != "" else "")
            cells.append(f"{text:>16}")
        print(f"{str(step):>4} {name:<18} " + " ".join(cells))

    print()
    print(f"the road, {dtype}, N={n}: TFLOP/s (x gain over the step before)")
    print(f"{'step':>4} {'name':<18} " + " ".join(f"{h:>16}" for h in heads))
    for kind in ("road", "candidate", "sdpa"):
        steps = sorted({(r["step"], r["step_name"]) for r in rows if r["kind"] == kind}, key=lambda s: str(s[0]).zfill(3))
        if steps and kind == "candidate":
            print("tuning candidates (x gain over the final kernel):")
        for step, name in steps:
            line(kind, step, name)
    for r in rows:
        if r["kind"] == "road" and r["gain"] != "" and r["gain"] < 1.0:
            print(f"  slower: step {r['step']} ({r['step_name']}) x{r['gain']:.2f} at d={r['d']} N={r['N']} "
                  f"{'causal' if r['causal'] else 'non-causal'}")
    # Where candidates were timed: which shape was fastest at each point, and what the final kernel gives up.
    final = max((r["step"] for r in rows if r["kind"] == "road"), default=None)
    tuned = [r for r in rows if r["kind"] == "candidate" or (r["kind"] == "road" and r["step"] == final)]
    for d in sorted({r["d"] for r in rows if r["kind"] == "candidate"}):
        wins, worst = {}, 1.0
        for point in sorted({(r["N"], r["causal"]) for r in tuned if r["d"] == d}):
            here = [r for r in tuned if (r["d"], r["N"], r["causal"]) == (d, *point)]
            best = max(here, key=lambda r: r["tflops"])
            label = "final kernel" if best["step"] == final else f"step {best['step']} ({best['step_name']})"
            wins[label] = wins.get(label, 0) + 1
            worst = min([worst] + [r["tflops"] / best["tflops"] for r in here if r["step"] == final])
        ranked = ", ".join(f"{label} at {k}" for label, k in sorted(wins.items(), key=lambda kv: -kv[1]))
        print(f"  fastest tile shape, d={d}, over {sum(wins.values())} points: {ranked}; "
              f"the final kernel reaches x{worst:.2f} of the fastest at worst")


STAGE11_COLUMNS = records.POINT + [
    Column("stage11", "stage11", 8), Column("stage07", "stage07", 8), Column("flash", "flash", 8), Column("cudnn", "cudnn", 8),
    Column("vs_cudnn", "11/cudnn", 9, ".2f"), Column("vs_flash", "11/flash", 9, ".2f"), Column("vs_stage07", "11/07", 7, ".2f"),
    Column("pct_of_wgmma", "% wgmma", 8, ".1f%")]


def print_stage11_tables(args, idx, rows, wgmma, gpu_name, date, round_idx=()):
    """Stage 11's final kernel against SDPA cuDNN and flash and stage 07's final kernel, one table
    per dtype, then the worst ratio to each. With several rounds, 11/cudnn is also given as its
    median over the rounds with min and max (the last columns)."""
    several = len(round_idx) > 1
    worst = {}  # label -> (ratio, dtype, d, N, causal), the lowest seen
    spread_col = [Column("vs_cudnn_over_rounds", "11/cudnn over %d rounds" % len(round_idx), 26, "ratio")] if several else []
    for t in args.dtypes:
        table = Table("stage11", STAGE11_COLUMNS + spread_col + [Column("bad", "BAD", 0, "flag")], {
            "title": f"{gpu_name}, {date}: stage 11 in {t}, TFLOP/s (target: 11 / cudnn >= 1.0)"
                     + (f"; wgmma bf16 ceiling {wgmma:.0f} TFLOP/s" if wgmma else ""),
            "dtype": t, "ceiling": wgmma, "rounds": len(round_idx)})
        for d in args.head_dims:
            for n in args.sizes:
                for c in causal_values(args.causal):
                    s11, s7, fl, cu = (idx.get((i, t, n, d, int(c))) for i in ("stage11", "stage07", "sdpa_flash", "sdpa_cudnn"))
                    if s7 is None:  # stage 07 not timed in this run: step 0 of stage 11's road is the same kernel
                        s7 = idx.get(("stage11_step0", t, n, d, int(c)))
                    rc, rf, r7 = ratio(s11, cu), ratio(s11, fl), ratio(s11, s7)
                    for label, x in (("stage11 / sdpa_cudnn", rc), ("stage11 / sdpa_flash", rf), ("stage11 / stage07", r7)):
                        if x is not None and (label not in worst or x < worst[label][0]):
                            worst[label] = (x, t, d, n, c)
                    pct = 100 * float(s11["tflops"]) / wgmma if s11 and wgmma else None
                    spread = []
                    if several:
                        st = round_ratio(round_idx, "stage11", "sdpa_cudnn", (t, n, d, int(c)))
                        spread = [None if st is None else list(st[:3])]
                        label = "stage11 / sdpa_cudnn, median over rounds"
                        if st is not None and (label not in worst or st[0] < worst[label][0]):
                            worst[label] = (st[0], t, d, n, c)
                    table.add(d, n, c, value(s11), value(s7), value(fl), value(cu), rc, rf, r7, pct, *spread, is_bad(s11))
        print()
        show(table)
        print_refused(rows, t)
    if worst:
        print()
        found = worst_table("worst", "worst stage 11 ratio", worst)
        for label, x, t, d, n, c in found.rows:
            print(f"worst {label} ratio: {x:.2f} {where(t, d, n, c)}")



def road11_rows(args, bench, idx, ceiling, wgmma):
    """One row per stage 11 step and shape (its gain over the step before, its ratio to cuDNN and
    flash); and SDPA cuDNN and flash at each shape."""
    road = {s["step"]: s for s in bench.get("stage11_road", [])}
    by_step = {}
    for r in bench["results"]:
        if r["impl"].startswith("stage11") and r["dtype"] in args.dtypes:
            by_step[(r["step"], r["dtype"], r["N"], r["d"], int(r["causal"]))] = r
    out = []
    shapes = sorted({k[1:] for k in by_step}, key=lambda k: (k[0] != "bf16", k[0], k[2], k[1], k[3]))
    for t, n, d, c in shapes:
        flash, cudnn = idx.get(("sdpa_flash", t, n, d, c)), idx.get(("sdpa_cudnn", t, n, d, c))
        steps = sorted(k[0] for k in by_step if k[1:] == (t, n, d, c))
        for i, step in enumerate(steps):
            r = by_step[(step, t, n, d, c)]
            prev = by_step.get((steps[i - 1], t, n, d, c)) if i > 0 else None
            tf = float(r["tflops"])
            out.append(dict(kind="road", impl=r["impl"], step=step, step_name=r.get("step_name", ""),
                            idea=road.get(step, {}).get("idea", ""), dtype=t, d=d, N=n, causal=c, tflops=tf,
                            median_ms=r["median_ms"], gain=ratio(r, prev) if prev else "",
                            gain_over=steps[i - 1] if prev else "", vs_flash=ratio(r, flash) if flash else "",
                            vs_cudnn=ratio(r, cudnn) if cudnn else "",
                            pct_of_mma=100 * tf / ceiling if ceiling and step == 0 else "",
                            pct_of_wgmma=100 * tf / wgmma if wgmma and step != 0 else "", check=r.get("check", ""),
                            gpu=bench["gpu"], sm_clock_mhz=r["sm_clock_mhz"], date=bench["date"]))
        for name, sd in (("cudnn", cudnn), ("flash", flash)):
            if sd:
                out.append(dict(kind="sdpa", impl="sdpa_" + name, step="", step_name="SDPA " + name,
                                idea=f"PyTorch SDPA, {name} backend", dtype=t, d=d, N=n, causal=c, tflops=float(sd["tflops"]),
                                median_ms=sd["median_ms"], gain="", gain_over="", vs_flash=ratio(sd, flash) if flash else "",
                                vs_cudnn=ratio(sd, cudnn) if cudnn else "", pct_of_mma="",
                                pct_of_wgmma=100 * float(sd["tflops"]) / wgmma if wgmma else "", check="",
                                gpu=sd["gpu"], sm_clock_mhz=sd["sm_clock_mhz"], date=sd["date"]))
    return out


def print_road11(args, rows):
    """Stage 11's road in bf16 (or the first dtype timed): for each N, a row per step and a column
    per (d, causal) with TFLOP/s, the gain over the step before and the ratio to cuDNN; then the
    steps that made something slower."""
    dtype = "bf16" if any(r["dtype"] == "bf16" for r in rows) else rows[0]["dtype"]
    rows = [r for r in rows if r["dtype"] == dtype]
    for n in sorted({r["N"] for r in rows}):
        cols = sorted({(r["d"], r["causal"]) for r in rows if r["N"] == n})
        cell = {(r["kind"], r["step"], r["step_name"], r["d"], r["causal"]): r for r in rows if r["N"] == n}
        print()
        print(f"stage 11's road, {dtype}, N={n}: TFLOP/s (x gain over the step before; /cudnn)")
        print(f"{'step':>4} {'name':<20} " + " ".join(f"{'d=%d %s' % (d, 'causal' if c else 'full'):>24}" for d, c in cols))
        for kind in ("road", "sdpa"):
            for step, name in sorted({(r["step"], r["step_name"]) for r in rows if r["kind"] == kind and r["N"] == n},
                                     key=lambda s: (str(s[0]).zfill(3), s[1])):
                cells = []
                for d, c in cols:
                    r = cell.get((kind, step, name, d, c))
                    if r is None:
                        text = "-"
                    else:
                        text = "%.1f" % r["tflops"] + (" x%.2f" % r["gain"] if r["gain"] != "" else "")
                        text += " /%.2f" % r["vs_cudnn"] if r["vs_cudnn"] != "" and kind == "road" else ""
                        text += " BAD" if r.get("check") == "BAD" else ""
                    cells.append(f"{text:>24}")
                print(f"{str(step):>4} {name:<20} " + " ".join(cells))
    for r in rows:
        if r["kind"] == "road" and r["gain"] != "" and r["gain"] < 1.0:
            print(f"  slower: step {r['step']} ({r['step_name']}) x{r['gain']:.2f} at d={r['d']} N={r['N']} "
                  f"{'causal' if r['causal'] else 'non-causal'}")


# ----------------------------------------------------------------------------- stage 10
# Stage 10's rows (bench_gpu --model07 and --varlen07 with stage 09) are named after their
# switches: ours "stage10_<variant>" (stage10_gqa8, stage10_window4095, stage10_dropout0.1, the
# plain causal kernels stage10_causal, the packed batch stage10_varlen), SDPA's
# "sdpa_<backend>_<variant>" on the same point, so that index(), median_rows() and round_ratio()
# take them as they take every other row. SDPA's padded batch is "sdpa_<backend>_padded", beside
# stage10_varlen. All of them count the FLOPs of the visible (query, key) pairs only.
STAGE10_BACKENDS = ("flash", "cudnn", "efficient")
STAGE10_PASSES = ("forward", "backward", "fwd+bwd")
STAGE10_COLUMNS = ["kind", "variant", "ours", "other", "pass", "dtype", "d", "N", "B", "H", "value", "lo", "hi", "rounds",
                   "ours_ms", "other_ms", "ours_tflops", "other_tflops", "note", "gpu", "date", "padded_bytes", "packed_bytes"]
# What the window's time over the plain causal kernel's should stay under at N = 16384 with a
# 4096-key window: a quarter of the pairs (7/32 of the causal triangle's), plus the diagonal blocks.
STAGE10_WINDOW_TARGET = 0.35


def parse_model_spec(spec):
    """A --model07 point GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]] as a dict (ValueError when malformed).

    >>> parse_model_spec("8/-1/0")["group"], parse_model_spec("1/-1/0/0/0.1")["dropout"]
    (8, 0.1)
    """
    x = [float(p) for p in spec.split("/")]
    if not 3 <= len(x) <= 5 or x[0] < 1:
        raise ValueError(f"--model07 {spec}: expected GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]] with GROUP >= 1")
    x += [0.0] * (5 - len(x))
    return dict(group=int(x[0]), left=int(x[1]), right=int(x[2]), softcap=x[3], dropout=x[4])


def sdpa_backends_for(spec):
    """The SDPA backends that are timed beside a --model07 point: flash, cuDNN and efficient for
    grouped heads (enable_gqa), flash alone with dropout; none with a window or a soft cap (SDPA's
    fused kernels have neither).

    >>> sdpa_backends_for(parse_model_spec("4/-1/0")), sdpa_backends_for(parse_model_spec("1/4095/0"))
    (('flash', 'cudnn', 'efficient'), ())
    >>> sdpa_backends_for(parse_model_spec("1/-1/0/0/0.1"))
    ('flash',)
    """
    if spec["softcap"] > 0 or spec["left"] >= 0 or spec["right"] != 0:
        return ()
    return ("flash",) if spec["dropout"] > 0 else STAGE10_BACKENDS


def causal_pairs(n):
    """Visible (query, key) pairs of one causal head of n queries and n keys.

    >>> causal_pairs(4)
    10
    """
    return n * (n + 1) // 2


def visible_flops(pairs, d, pass_):
    """FLOPs of `pairs` visible pairs (all heads and batch entries) in one pass, as bench_gpu counts them."""
    return 4.0 * d * pairs * PASS_FLOPS[pass_]


def stage10_row(impl, dtype, b, h, n, d, pairs, pass_, fields, gpu_name, date, **extra):
    """One SDPA row of stage 10 from what time_sdpa_passes() yielded."""
    row = dict(impl=impl, dtype=dtype, B=b, H=h, N=n, d=d, causal=1, gpu=gpu_name, date=date, **extra, **fields,
               **{"pass": pass_})
    if row.get("median_ms") is not None:
        row["tflops"] = visible_flops(pairs, d, pass_) / (row["median_ms"] * 1e-3) * 1e-12
    return row


def stage10_points(ours_rows):
    """The dense points of stage 10 in bench_gpu's rows: (variant, spec, dtype, B, H, N, d), one per
    forward row of a --model07 point or of the plain causal kernels (spec 1/-1/0)."""
    points = set()
    for r in ours_rows:
        variant = r["impl"][len("stage10_"):]
        if r["impl"].startswith("stage10_") and pass_of(r) == "forward" and (r.get("spec") or variant == "causal"):
            points.add((variant, r.get("spec") or "1/-1/0", r["dtype"], int(r["B"]), int(r["H"]), int(r["N"]), int(r["d"])))
    return sorted(points, key=lambda p: (p[2], p[6], p[5], p[0]))


def run_sdpa_stage10(args, ours_rows, gpu_name, date):
    """SDPA beside stage 10's points (those bench_gpu timed in `ours_rows`), forward, backward and
    the pair: grouped heads through enable_gqa=True (k and v of H / GROUP heads) pinned to flash,
    cuDNN and efficient in turn, dropout through flash's dropout_p, causal; and the packed batch of
    --varlen07 as nested jagged tensors (B, H, j, d) and as a dense batch padded to the longest
    sequence with a mask of each sequence's causal triangle (keys past its end masked), with each
    backend. A backend that refuses gives a row whose note says why."""
    import torch
    import torch.nn.functional as F

    backends, dtypes, flush = sdpa_setup()
    rows = []
    for variant, spec, t, b, h, n, d in stage10_points(ours_rows):
        m = parse_model_spec(spec)
        names = sdpa_backends_for(m)
        if not names:
            continue
        gen = torch.Generator(device="cuda").manual_seed(1234)
        q32, k32, v32, do32 = (torch.randn(b, hh, n, d, device="cuda", generator=gen) for hh in (h, h // m["group"], h // m["group"], h))
        point = []
        for name in names:
            q, k, v = (x.to(dtypes[t]).requires_grad_() for x in (q32, k32, v32))
            attend = (lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=m["dropout"],
                                                                          enable_gqa=True))
            for pass_, fields in time_sdpa_passes(args, backends[name], (q, k, v), attend, lambda o: torch.empty_like(o).copy_(do32),
                                                  flush, STAGE10_PASSES):
                rows.append(stage10_row(f"sdpa_{name}_{variant}", t, b, h, n, d, b * h * causal_pairs(n), pass_, fields,
                                        gpu_name, date, spec=spec))
                point.append(f"{name}/{pass_}=" + (f"{rows[-1]['tflops']:.1f}" if "tflops" in rows[-1] else "unsupported"))
            del q, k, v
        print(f"sdpa stage 10 {variant} {t} d={d} N={n} B={b} H={h}: {' '.join(point)} TFLOP/s", flush=True)
        del q32, k32, v32, do32
        torch.cuda.empty_cache()
    if args.varlen07:
        for d in args.head_dims:
            for t in args.dtypes:
                rows += sdpa_packed_batch(args, backends, dtypes[t], t, d, flush, gpu_name, date)
    return rows


def sdpa_packed_batch(args, backends, dtype, dtype_name, d, flush, gpu_name, date):
    """SDPA on the packed batch of --varlen07 (causal in each sequence), rows sdpa_<backend>_varlen
    (nested tensors of the jagged layout, torch.nested.nested_tensor_from_jagged) and sdpa_<backend>_padded (padded to the longest, with a mask; the
    bytes of its q, k, v, o and mask beside those of the packed q, k, v, o in padded_bytes and
    packed_bytes)."""
    import torch
    import torch.nn.functional as F

    lengths = args.varlen07
    h, total, batch, longest = max(1, args.width // d), sum(lengths), len(lengths), max(lengths)
    pairs = h * sum(causal_pairs(x) for x in lengths)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    q32, k32, v32, do32 = (torch.randn(total, h, d, device="cuda", generator=gen) for _ in range(4))  # packed (total, H, d)
    element = torch.tensor([], dtype=dtype).element_size()
    packed_bytes = 4 * total * h * d * element
    rows, point = [], []

    # The nested tensors share one offsets tensor (cu_seqlens), so that q, k, v, o and dO have the
    # same ragged dimension j; the gradients are taken of their packed values (total, H, d).
    offsets = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(batch)], dtype=torch.int64, device="cuda")

    def jagged(values):  # (B, H, j, d), a view of the packed values (total, H, d)
        return torch.nested.nested_tensor_from_jagged(values, offsets).transpose(1, 2)

    def padded(x):  # (B, H, longest, d), zeros past each sequence's end
        return torch.nn.utils.rnn.pad_sequence(list(x.to(dtype).split(lengths)), batch_first=True).transpose(1, 2).contiguous()

    # Query i of sequence b sees key j when j <= i (causal) and j < its length (keys past the end
    # are padding); padded query rows see key 0 at least, so no row is empty.
    i = torch.arange(longest, device="cuda")
    ends = torch.tensor(lengths, device="cuda").view(batch, 1, 1, 1)
    mask = (i.view(1, 1, 1, -1) <= i.view(1, 1, -1, 1)) & (i.view(1, 1, 1, -1) < ends)  # (B, 1, longest, longest)
    padded_bytes = 4 * batch * h * longest * d * element + mask.numel() * mask.element_size()
    memory = dict(padded_bytes=padded_bytes, packed_bytes=packed_bytes)
    for layout in ("varlen", "padded"):
        for name in STAGE10_BACKENDS:
            note = ""
            try:
                if layout == "varlen":
                    q, k, v = (x.to(dtype).requires_grad_() for x in (q32, k32, v32))
                    do = jagged(do32.to(dtype))

                    def attend(q=q, k=k, v=v):  # the views are taken in each call, inside the graph of that call
                        return F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), is_causal=True)

                    def make_do(o, do=do):
                        return do
                else:
                    q, k, v = (padded(x).requires_grad_() for x in (q32, k32, v32))
                    do = padded(do32)
                    note = (f"padded to {longest}: q, k, v, o and the mask {padded_bytes / 2**20:.0f} MiB; packed q, k, v, o "
                            f"{packed_bytes / 2**20:.0f} MiB")

                    def attend(q=q, k=k, v=v):
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

                    def make_do(o, do=do):
                        return torch.empty_like(o).copy_(do)
                results = list(time_sdpa_passes(args, backends[name], (q, k, v), attend, make_do, flush, STAGE10_PASSES))
                del q, k, v, do
            except REFUSALS + (torch.OutOfMemoryError,) as e:  # the nested or padded inputs themselves
                results = [(pass_, dict(note="unsupported: " + first_line(e))) for pass_ in STAGE10_PASSES]
            for pass_, fields in results:
                if note and "note" not in fields:
                    fields = dict(fields, note=note)
                rows.append(stage10_row(f"sdpa_{name}_{layout}", dtype_name, batch, h, total, d, pairs, pass_, fields, gpu_name,
                                        date, **(memory if layout == "padded" else {})))
                point.append(f"{name}/{layout}/{pass_}=" + (f"{rows[-1]['tflops']:.1f}" if "tflops" in rows[-1] else "unsupported"))
    print(f"sdpa stage 10 packed batch {dtype_name} d={d} H={h} B={batch} tokens={total}: {' '.join(point)} TFLOP/s", flush=True)
    del q32, k32, v32, do32, mask, offsets
    torch.cuda.empty_cache()
    return rows


def time_ratio(a, b):
    """a's time over b's, or None when either has none."""
    return float(a["median_ms"]) / float(b["median_ms"]) if a and b and float(b["median_ms"]) > 0 else None


def stage10_comparisons(rows, round_rows):
    """Stage 10's ratios, one dict per comparison (STAGE10_COLUMNS), from the median rows `rows` and
    each round's rows `round_rows`: value, lo and hi are the median, min and max over the rounds,
    each taken within one round. Kinds:
      vs_sdpa    ours / SDPA by rate (above 1: ours faster), each variant beside each backend that
                 ran it, and the packed batch beside SDPA's nested and padded batches
      vs_causal  a window's time over the plain causal kernels' at the same N (below 1: faster)
      vs_dense   a packed batch's rate over the dense kernel's on the uniform batch of the same tokens
      memory     SDPA's padded batch: the bytes of its tensors and mask over the packed tensors' (no rounds;
                 the two counts in padded_bytes and packed_bytes)
    A side without a time (a refused pass) leaves value empty and gives its note.

    >>> mk = lambda impl, ms, p="forward", **x: dict(impl=impl, dtype="bf16", B=1, H=2, N=8, d=64, causal=1, median_ms=ms,
    ...                                               tflops=1.0 / ms, **{"pass": p}, **x)
    >>> r1 = [mk("stage10_gqa8", 1.0), mk("sdpa_flash_gqa8", 1.2), mk("stage10_causal", 2.0), mk("stage10_window4", 0.5)]
    >>> r2 = [mk("stage10_gqa8", 1.0), mk("sdpa_flash_gqa8", 1.4), mk("stage10_causal", 2.0), mk("stage10_window4", 0.7)]
    >>> c = stage10_comparisons(r1, [r1, r2])
    >>> [(x["kind"], x["variant"], x["other"], round(x["value"], 2), x["rounds"]) for x in c]
    [('vs_sdpa', 'gqa8', 'sdpa_flash_gqa8', 1.3, 2), ('vs_causal', 'window4', 'stage10_causal', 0.3, 2)]
    """
    by_pass = {p: [index(r, p) for r in round_rows] for p in STAGE10_PASSES}
    timed = {p: index(rows, p) for p in STAGE10_PASSES}
    every = {(r["impl"], r["dtype"], int(r["N"]), int(r["d"]), pass_of(r)): r for r in rows}
    out = []

    def add(kind, a, b, pass_, key, of=ratio):
        ra, rb = every.get((a, *key[:3], pass_)), every.get((b, *key[:3], pass_))
        if ra is None or rb is None:
            return
        st = round_ratio(by_pass[pass_], a, b, key, of)
        ta, tb = timed[pass_].get((a, *key)), timed[pass_].get((b, *key))
        note = "; ".join(x for x in ((ra.get("note") or "") if ta is None else "", (rb.get("note") or "") if tb is None else "") if x)
        out.append(dict(kind=kind, variant=a[len("stage10_"):], ours=a, other=b, dtype=key[0], d=key[2], N=key[1],
                        B=ra["B"], H=ra["H"], value=st[0] if st else "", lo=st[1] if st else "", hi=st[2] if st else "",
                        rounds=st[3] if st else 0, ours_ms=ta["median_ms"] if ta else "", other_ms=tb["median_ms"] if tb else "",
                        ours_tflops=ta["tflops"] if ta else "", other_tflops=tb["tflops"] if tb else "", note=note,
                        gpu=ra.get("gpu", ""), date=ra.get("date", ""), **{"pass": pass_}))

    ours = sorted({(r["impl"], r["dtype"], int(r["N"]), int(r["d"]), int(r["causal"])) for r in rows
                   if r["impl"].startswith("stage10_")}, key=lambda k: (k[1], k[3], k[2], k[0]))
    for impl, t, n, d, c in ours:
        key, variant = (t, n, d, c), impl[len("stage10_"):]
        for pass_ in STAGE10_PASSES:
            for name in STAGE10_BACKENDS:
                add("vs_sdpa", impl, f"sdpa_{name}_{variant}", pass_, key)
                if variant == "varlen":
                    add("vs_sdpa", impl, f"sdpa_{name}_padded", pass_, key)
            if variant.startswith("window") or "_window" in variant:
                add("vs_causal", impl, "stage10_causal", pass_, key, time_ratio)
            if variant in ("varlen", "varlen_uniform"):
                add("vs_dense", impl, "stage10_dense_uniform", pass_, key)
    for r in rows:
        if r.get("padded_bytes") and pass_of(r) == "forward":
            out.append(dict(kind="memory", variant="varlen", ours="stage10_varlen", other=r["impl"], dtype=r["dtype"], d=int(r["d"]),
                            N=int(r["N"]), B=r["B"], H=r["H"], value=float(r["padded_bytes"]) / float(r["packed_bytes"]),
                            lo="", hi="", rounds=0, ours_ms="", other_ms="", ours_tflops="", other_tflops="",
                            note=f"{r['padded_bytes']} bytes padded, {r['packed_bytes']} packed", gpu=r.get("gpu", ""),
                            date=r.get("date", ""), padded_bytes=int(r["padded_bytes"]), packed_bytes=int(r["packed_bytes"]),
                            **{"pass": "forward"}))
    return out


def spread(c):
    """A comparison's median over rounds with its min and max, '1.02 [0.99-1.05]'; its note's start when it has no value."""
    if c is None:
        return "-"
    if c["value"] == "":
        return "refused" if "refused" in c["note"] else "unsupported" if "unsupported" in c["note"] else "-"
    return f"{c['value']:.2f} [{c['lo']:.2f}-{c['hi']:.2f}]"


def print_stage10_tables(comparisons, rows, gpu_name, date):
    """Stage 10's tables: grouped heads and dropout beside SDPA's backends (forward and the
    forward + backward pair; the backward alone is in stage10.csv), the windows' time over the
    plain causal kernels', the packed batch beside the uniform one and SDPA's nested and padded
    batches, then what was refused and why."""
    by = {(c["kind"], c["variant"], c["other"], c["pass"], c["dtype"], c["d"], c["N"]): c for c in comparisons}
    print()
    print(f"{gpu_name}, {date}: stage 10, ours / SDPA by rate (TFLOP/s of the visible pairs), median [min-max] over rounds; "
          "fwd: the forward, f+b: forward + backward as one pair (the backward alone: stage10.csv); gqa<g>: Hq / Hk = g "
          "(SDPA with enable_gqa=True), causal: the plain causal kernels (Hq = Hk; SDPA with enable_gqa=True too)")
    head = f"{'variant':>14} {'dtype':>5} {'d':>4} {'N':>6} {'ours fwd':>9} {'ours f+b':>9}"
    print(head + "".join(f" {name + ' fwd':>17} {name + ' f+b':>17}" for name in STAGE10_BACKENDS))
    model = sorted({(c["variant"], c["dtype"], c["d"], c["N"]) for c in comparisons
                    if c["kind"] == "vs_sdpa" and c["variant"] not in ("varlen",)}, key=lambda k: (k[1], k[2], k[3], k[0]))
    for v, t, d, n in model:
        cells = []
        for name in STAGE10_BACKENDS:
            for pass_ in ("forward", "fwd+bwd"):
                cells.append(spread(by.get(("vs_sdpa", v, f"sdpa_{name}_{v}", pass_, t, d, n))))
        tf = [next((c["ours_tflops"] for c in comparisons if (c["variant"], c["pass"], c["dtype"], c["d"], c["N"]) == (v, p, t, d, n)
                    and c["ours_tflops"] != ""), None) for p in ("forward", "fwd+bwd")]
        print(f"{v:>14} {t:>5} {d:>4} {n:>6} {rfmt(tf[0], 1):>9} {rfmt(tf[1], 1):>9}" + "".join(f" {x:>17}" for x in cells))

    windows = sorted({(c["variant"], c["dtype"], c["d"], c["N"]) for c in comparisons if c["kind"] == "vs_causal"},
                     key=lambda k: (k[1], k[2], k[3], k[0]))
    if windows:
        print()
        print(f"windows: time over the plain causal kernels' at the same N, median [min-max] over rounds (SDPA's flash has no "
              f"window: ours alone); target <= {STAGE10_WINDOW_TARGET} at N = 16384 with a 4096-key window")
        print(f"{'variant':>14} {'dtype':>5} {'d':>4} {'N':>6} {'fwd ms':>8} {'/causal':>17} {'f+b ms':>8} {'/causal':>17} "
              f"{'bwd ms':>8} {'/causal':>17}")
        for v, t, d, n in windows:
            cs = [by.get(("vs_causal", v, "stage10_causal", p, t, d, n)) for p in ("forward", "fwd+bwd", "backward")]
            verdict = ""
            if v == "window4095" and n == 16384 and cs[0] and cs[0]["value"] != "":
                verdict = "  met" if cs[0]["value"] <= STAGE10_WINDOW_TARGET else "  not met"
            print(f"{v:>14} {t:>5} {d:>4} {n:>6} " + " ".join(f"{rfmt(c['ours_ms'] if c and c['ours_ms'] != '' else None, 3):>8} "
                                                              f"{spread(c):>17}" for c in cs) + verdict)

    packed = sorted({(c["dtype"], c["d"], c["N"]) for c in comparisons if c["variant"] == "varlen"})
    if packed:
        print()
        print("the packed batch of mixed lengths: its rate over the dense kernel's on a uniform batch of the same tokens (ours), "
              "and ours / SDPA's nested (jagged) and padded (with a mask) batches by rate; memory: SDPA's padded q, k, v, o and "
              "mask over the packed q, k, v, o")
        print(f"{'dtype':>5} {'d':>4} {'tokens':>6} {'pass':>8} {'ours':>7} {'/dense':>17} {'uniform/dense':>17}"
              + "".join(f" {name + ' nested':>17} {name + ' padded':>17}" for name in STAGE10_BACKENDS) + f" {'memory':>7}")
        for t, d, n in packed:
            for pass_ in STAGE10_PASSES:
                ours = by.get(("vs_dense", "varlen", "stage10_dense_uniform", pass_, t, d, n))
                cells = [spread(ours), spread(by.get(("vs_dense", "varlen_uniform", "stage10_dense_uniform", pass_, t, d, n)))]
                for name in STAGE10_BACKENDS:
                    cells += [spread(by.get(("vs_sdpa", "varlen", f"sdpa_{name}_{layout}", pass_, t, d, n))) for layout in ("varlen", "padded")]
                mem = [c["value"] for c in comparisons if c["kind"] == "memory" and (c["dtype"], c["d"], c["N"]) == (t, d, n)]
                tf = ours["ours_tflops"] if ours and ours["ours_tflops"] != "" else None
                print(f"{t:>5} {d:>4} {n:>6} {pass_:>8} {rfmt(tf, 1):>7}" + "".join(f" {x:>17}" for x in cells)
                      + f" {rfmt(mem[0], 2, 'x') if mem and pass_ == 'forward' else '':>7}")

    notes = {}
    for r in rows:
        if (r["impl"].startswith("stage10_") or r["impl"].startswith("sdpa_") and r["impl"].count("_") >= 2) and r.get("note") \
                and r.get("median_ms") in (None, ""):
            passes, where = notes.setdefault((r["impl"], r["note"]), ([], []))
            passes += [pass_of(r)] if pass_of(r) not in passes else []
            where += [f"{r['dtype']} d={r['d']} N={r['N']}"] if f"{r['dtype']} d={r['d']} N={r['N']}" not in where else []
    if notes:
        print()
        print("refused (no time):")
        for (impl, note), (passes, where) in sorted(notes.items()):
            print(f"  {impl} {', '.join(passes)}: {note} ({', '.join(where[:4])}{', ...' if len(where) > 4 else ''})")


# ----------------------------------------------------------------------------- main
def run_meta(args, bench, gpu_name, date):
    """What the run was, for its tables' files: the GPU, the date, the command, the rounds, the
    problems' size (B*N tokens, H*d width), and the step each stage's default kernel was in (from
    bench_gpu's record: the final steps of stages 07 and 11, stage 09's default main kernel)."""
    steps = {"07": bench.get("stage07_final_step"), "09": bench.get("stage09_default_step"),
             "11": bench.get("stage11_final_step")}
    return dict(gpu=gpu_name, date=date, command=" ".join(["bench/sdpa_compare.py"] + sys.argv[1:]), rounds=args.rounds,
                tokens=args.tokens, width=args.width, stages=list(args.stages),
                default_steps={k: v for k, v in steps.items() if k in args.stages and v is not None})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-exe", required=True, help="path to the bench_gpu executable")
    parser.add_argument("--out-dir", default=os.path.join(here, "..", "docs", "results"))
    parser.add_argument("--stages", nargs="+", default=["05", "06", "07"], choices=["05", "06", "07", "09", "10", "11"],
                        help="09: stage 07's forward and stage 09's backward, beside SDPA's backward; 11: the Hopper "
                        "kernel (sm_90 only), beside SDPA cuDNN and flash and stage 07; 10: stage 10's switches "
                        "(--model07 points and the --varlen07 batch, forward and backward: bench_gpu runs with stage 09) "
                        "beside SDPA with grouped heads (enable_gqa; flash, cuDNN, efficient), dropout (flash), nested "
                        "jagged and padded batches; writes stage10.txt and stage10.csv")
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=["bf16", "fp16"],
                        help="16-bit types of stages 07, 09 and 11 and of the SDPA flash/cudnn rows beside them")
    parser.add_argument("--steps", nargs="+", default=[], help="stage 07 steps (bench_gpu --steps): numbers, all or road")
    parser.add_argument("--steps11", nargs="+", default=[],
                        help="stage 11 steps (bench_gpu --steps11): numbers, all or road; several give road11.csv")
    parser.add_argument("--steps09", type=int, nargs="+", default=[],
                        help="stage 09 main kernels timed beside the default one (bench_gpu --steps09)")
    parser.add_argument("--steps09-backward-only", action="store_true",
                        help="with --steps09: time those steps' backward with atomic dQ alone, without their fwd+bwd and "
                             "deterministic rows (bench_gpu --steps09-backward-only; their tables show '-' there)")
    parser.add_argument("--model07", nargs="+", default=[], metavar="SPEC",
                        help="with stage 10: bench_gpu's --model07 points, GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]] (e.g. 8/-1/0 "
                        "4/-1/0 1/4095/0 1/-1/0/0/0.1); SDPA runs those it has (grouped heads, dropout, causal)")
    parser.add_argument("--varlen07", type=lambda s: [int(x) for x in s.split(",")], default=[], metavar="LENGTHS",
                        help="with stage 10: the packed batch, comma-separated sequence lengths (bench_gpu --varlen07)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--tokens", type=int, default=16384, help="B * N")
    parser.add_argument("--width", type=int, default=2048, help="H * d")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3,
                        help="times the whole sequence (our kernels, then SDPA) runs; each point's row is that of the "
                        "round with the median time, and ratios are reported as the median over rounds with min and max")
    parser.add_argument("--check", type=lambda s: s.lower() not in ("0", "false", "no"), default=True,
                        help="bench_gpu's checks of every point (true/false)")
    parser.add_argument("--sdpa", type=lambda s: s.lower() not in ("0", "false", "no"), default=True,
                        help="time PyTorch SDPA beside our stages (true/false)")
    parser.add_argument("--mma-ceiling-exe", help="mma_ceiling executable (default: beside bench_gpu)")
    parser.add_argument("--mma-ceiling-json", help="read the ceiling from this mma_ceiling --json output instead of running it")
    parser.add_argument("--mma-ceiling-tflops", type=float, help="the mma.sync bf16 ceiling, given instead of measured")
    parser.add_argument("--wgmma-ceiling-json", help="read the wgmma ceiling from this wgmma_ceiling --json output instead of "
                        "running it")
    parser.add_argument("--wgmma-ceiling-tflops", type=float, help="the dense wgmma bf16 ceiling, given instead of measured")
    parser.add_argument("--road-n", type=int, default=4096, help="the N of the printed road tables")
    parser.add_argument("--merge-with", help="an earlier gpu_sweep.csv: its rows of (impl, dtype) pairs this run does not "
                        "measure are kept in the new gpu_sweep.csv")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for spec in args.model07:
        try:
            parse_model_spec(spec)
        except ValueError as e:
            parser.error(str(e))
    if any(x < 0 for x in args.varlen07):
        parser.error("--varlen07: lengths are 0 or more")
    os.makedirs(args.out_dir, exist_ok=True)

    ceiling, ceilings = run_mma_ceiling(args) if "07" in args.stages else (None, {})
    wgmma = run_wgmma_ceiling(args) if "11" in args.stages else None
    have_torch = False
    if args.sdpa:
        try:
            import torch

            have_torch = torch.cuda.is_available()
        except ImportError:
            pass
    # The whole sequence (our kernels, then SDPA) once per round, so that every ratio can be taken
    # between timings of the same round, and its spread over rounds seen; our points in another
    # order each round (round_order()).
    ours_rounds, sdpa_rounds, checks_ok = [], [], True
    for rnd in range(args.rounds):
        if args.rounds > 1:
            print(f"round {rnd + 1} of {args.rounds}", flush=True)
        ours, ok = run_bench_gpu(round_order(args, rnd), ceiling, os.path.join(args.out_dir, "bench_gpu.json"),
                                 os.path.join(args.out_dir, "bench_gpu.csv"), wgmma)
        checks_ok = checks_ok and ok
        gpu_name, date = ours["gpu"], ours["date"]
        ours_rounds.append(ours)
        if have_torch:
            if rnd == 0:
                print(f"torch {torch.__version__}, timing SDPA backends on {torch.cuda.get_device_name(0)}", flush=True)
            sdpa_rounds.append(run_sdpa(args, gpu_name, date) if sdpa_plan(args) or sdpa_backward_plan(args) else [])
            if "10" in args.stages:
                sdpa_rounds[-1] += run_sdpa_stage10(args, ours["results"], gpu_name, date)
        elif args.sdpa and rnd == 0:
            print("torch with CUDA is not importable here: only our stages are in the results", flush=True)
    # Each point's row from the round whose time is the median of the rounds' (the lower middle
    # one for an even count): one row per point in the files, as with a single round.
    ours = dict(ours_rounds[-1], results=median_rows([o["results"] for o in ours_rounds]))
    rows = [dict(r, gpu=gpu_name, date=date, causal=int(r["causal"]), note=r.get("note") or "") for r in ours["results"]]
    if sdpa_rounds:
        rows += median_rows(sdpa_rounds)
    round_rows = [[dict(r, causal=int(r["causal"])) for r in o["results"]] + (sdpa_rounds[i] if sdpa_rounds else [])
                  for i, o in enumerate(ours_rounds)]
    round_idx = [index(r) for r in round_rows]
    measured = rows  # the tables show this run only; the files may also keep an earlier sweep's rows
    idx = index(measured)
    if args.merge_with and os.path.exists(args.merge_with):
        rows = merge_rows(rows, args.merge_with)

    csv_path = os.path.join(args.out_dir, "gpu_sweep.csv")
    write_csv(csv_path, rows, CSV_COLUMNS)
    meta = dict(gpu=gpu_name, date=date, max_sm_clock_mhz=ours["max_sm_clock_mhz"], method=ours["method"],
                torch=(torch.__version__ if have_torch else None))
    if ceilings or ceiling:
        meta["mma_ceiling_tflops"] = ceiling
        meta["ceilings"] = {k: dict(value=v["value"], unit=v["unit"], sm_clock_mhz=v["sm_clock_mhz"]) for k, v in ceilings.items()}
    if "stage07_road" in ours:
        meta["stage07_road"] = ours["stage07_road"]
        meta["stage07_final_step"] = ours["stage07_final_step"]
    if "stage11_road" in ours:
        meta["stage11_road"] = ours["stage11_road"]
        meta["stage11_final_step"] = ours["stage11_final_step"]
    if wgmma:
        meta["wgmma_ceiling_tflops"] = wgmma
    with open(os.path.join(args.out_dir, "gpu_sweep.json"), "w") as f:
        json.dump(dict(meta, results=rows), f, indent=1)

    PRINTED.meta.update(run_meta(args, ours, gpu_name, date))
    if any(s in FP32_STAGES for s in args.stages):
        print_fp32_table(args, idx, gpu_name, date)
    if "07" in args.stages:
        tee_to_file(os.path.join(args.out_dir, "stage07_sweep_table.txt"), print_stage07_tables, args, idx, measured, ceiling,
                    gpu_name, date)
        steps = {r["step"] for r in ours["results"] if r.get("step") is not None and not r["impl"].startswith("stage11")}
        if len(steps) > 1:
            write_road(args, meta, "road", road_rows(args, ours, idx, ceiling), ROAD_COLUMNS, "stage07_road_table.txt",
                       print_road)
    if "09" in args.stages:
        tee_to_file(os.path.join(args.out_dir, "stage09_sweep_table.txt"), print_stage09_tables, args, measured, gpu_name, date)
    if "11" in args.stages and any(r["impl"].startswith("stage11") for r in ours["results"]):
        tee_to_file(os.path.join(args.out_dir, "stage11_sweep_table.txt"), print_stage11_tables, args, idx, measured, wgmma,
                    gpu_name, date, round_idx)
        steps11 = {r["step"] for r in ours["results"] if r["impl"].startswith("stage11")}
        if len(steps11) > 1:
            write_road(args, meta, "road11", road11_rows(args, ours, idx, ceiling, wgmma), ROAD11_COLUMNS,
                       "stage11_road_table.txt", print_road11)
    elif "11" in args.stages:
        print("\nstage 11: no rows (bench_gpu skipped it: see its 'skipped' line)")
    if "10" in args.stages:
        comparisons = stage10_comparisons(measured, round_rows)
        write_csv(os.path.join(args.out_dir, "stage10.csv"), comparisons, STAGE10_COLUMNS)
        tee_to_file(os.path.join(args.out_dir, "stage10.txt"), print_stage10_tables, comparisons, measured, gpu_name, date)
    if args.rounds > 1 and any(s in ("07", "09", "11") for s in args.stages):
        tee_to_file(os.path.join(args.out_dir, "ratios_over_rounds.txt"), print_round_ratios, args, round_rows, gpu_name, date)
    records.write_tables(os.path.join(args.out_dir, "tables.json"), PRINTED)
    print(f"wrote {csv_path}")
    print(f"wrote {os.path.join(args.out_dir, 'tables.json')} (the cells of every table above)")
    if not checks_ok:
        print("FAILED: bench_gpu marked at least one point BAD or MISMATCH (see its lines above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
