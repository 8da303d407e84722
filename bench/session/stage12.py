"""Stage 12's experiments (the Hopper backward: K and V stationary per block, the query tiles streamed
by the TMA onto mbarriers, the five products on wgmma, dQ added by the TMA's bulk reduction; sm_90a):
its tests, and a sweep of its road through the stage's own executable.

`sweep12` runs stage12_hopper_backward --bench once per point and step, each appending its record
(the backward's median time, TFLOP/s, the checks against stage 09 and the verdict) to a JSON-lines
file of its own; step 0 is stage 09's default backward, run through stage 12's entry point on the
same GPU. Each round runs every point and step, then SDPA flash's and cuDNN's backward on the same
points in one Python process (SDPA_BACKWARD); `finish` writes stage12_sweep.csv (per point and round)
and stage12_sweep_table.txt (medians over rounds, with the spread of the ratio to cuDNN).
"""
import csv
import json
import os

from . import sanitize
from .experiment import Command, Experiment, Where, entries_match, file_lines, grep, in_results
from .ncu import NCU11_COUNTERS, NCU11_METRICS, labelled_reports, ncu_command
from .tools import SDPA_HEAD, ctest_gpu, ctest_summary

STAGE12 = "stages/12_hopper_backward/stage12_hopper_backward"


def _test12_commands(p, ctx):
    return ctest_gpu(ctx, "stage12", p["timeout"])


TEST12 = Experiment(
    name="test12",
    stage="12",
    description="the tests of stage 12 (ctest -R stage12): every step against stage 09 and the float64 gradients on "
                "the GPU, the command line",
    targets=("make_npy_inputs", "stage12_hopper_backward", "test_stage12"),
    params={"timeout": 600},
    param_help={"timeout": "seconds before ctest fails one test (a hung barrier)"},
    commands=_test12_commands,
    outputs=(),  # CTest writes nothing but its log (WORK/logs/test12.log)
    summary=ctest_summary,
)


def _record_name(step, dtype: str, d, n, causal: bool) -> str:
    return f"stage12_step{step}_{dtype}_d{d}_n{n}{'_causal' if causal else ''}.jsonl"


def sweep12_points(p) -> list:
    """Every (dtype, d, N, causal) of the grid as a dict, with B = tokens / N and H = width / d."""
    return [{"dtype": t, "head_dim": d, "seq": n, "causal": c, "batch": max(1, p["tokens"] // n),
             "heads": max(1, p["width"] // d)}
            for t in p["dtypes"] for d in p["head_dims"] for n in p["sizes"] for c in (False, True)]


# The SDPA side of sweep12, run as `python3 -c SDPA_BACKWARD POINTS_JSON OUT_JSONL REPEAT`: each
# point's backward alone, torch.autograd.grad(o, (q, k, v), dO, retain_graph=True) after one forward
# (as sdpa_compare.py times it), on the flash and cuDNN backends in the point's type, layout
# (B, H, N, d), inputs drawn from a normal distribution, the L2 flushed before each run, CUDA events,
# the median kept.
SDPA_BACKWARD = SDPA_HEAD + r"""
points, out, repeat = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
with open(out, "a") as f:
    for p in points:
        dtype = torch.bfloat16 if p["dtype"] == "bf16" else torch.float16
        shape = (p["batch"], p["heads"], p["seq"], p["head_dim"])
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        do = torch.randn(shape, device="cuda", dtype=dtype)
        for name in ("flash", "cudnn"):
            record = dict(p, backend=name, gpu=torch.cuda.get_device_name())
            try:
                with sdpa_kernel(BACKENDS[name]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"])
                    record["ms"] = time_call(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), repeat)
                del o
            except RuntimeError as e:  # a backend that does not take this shape
                record["error"] = str(e).splitlines()[0][:200]
            f.write(json.dumps(record) + "\n")
        del q, k, v, do
        torch.cuda.empty_cache()
"""


def _step_args(step) -> tuple:
    """A step of the sweep ("4", or "4d": step 4 in the deterministic order) as stage 12's options."""
    s = str(step)
    return ("--step", s[:-1], "--deterministic") if s.endswith("d") else ("--step", s)


def _ours_argv(ctx, point, step, repeat, path, warmup=3):
    argv = (ctx.exe(STAGE12), "--bench", "--reference", "never", "--dtype", point["dtype"],
            "--head-dim", str(point["head_dim"]), "--seq-q", str(point["seq"]), "--seq-k", str(point["seq"]),
            "--batch", str(point["batch"]), "--heads", str(point["heads"]), *_step_args(step),
            "--repeat", str(repeat), "--warmup", str(warmup), "--json", path)
    return argv + (("--causal",) if point["causal"] else ())


def _sweep12_commands(p, ctx):
    out = ctx.results("sweep12")
    points = sweep12_points(p)
    commands = []
    for r in range(p["rounds"]):
        for point in points:
            for step in p["steps"]:
                path = os.path.join(out, _record_name(step, point["dtype"], point["head_dim"], point["seq"], point["causal"]))
                commands.append(Command(_ours_argv(ctx, point, step, p["repeat"], path), ok=(0, 1)))
        if p["sdpa"]:
            commands.append(Command(("python3", "-c", SDPA_BACKWARD, json.dumps([dict(pt, round=r) for pt in points]),
                                     os.path.join(out, "stage12_sdpa.jsonl"), str(p["repeat"])),
                                    env={"PYTHONUNBUFFERED": "1"}))
    return commands


def backward_flops(point) -> float:
    """fa::attention_flops_backward: 2.5 times the forward's 4 B H N^2 d, halved when causal."""
    f = 4.0 * point["batch"] * point["heads"] * point["seq"] ** 2 * point["head_dim"] * 2.5
    return f / 2 if point["causal"] else f


def _point_key(r) -> tuple:
    return tuple(r[k] for k in ("dtype", "head_dim", "seq", "causal"))


def _sweep12_finish(p, ctx, where: Where):
    """stage12_sweep.csv: per point and round, each step's backward time and TFLOP/s beside SDPA flash's
    and cuDNN's, and each step's ratio to cuDNN (their time over ours: above 1 is faster)."""
    sdpa, gpus, dates = {}, set(), set()
    path = in_results(where, "stage12_sdpa.jsonl")
    for line in file_lines(path) if os.path.isfile(path) else []:
        r = json.loads(line)
        sdpa.setdefault((_point_key(r), r["round"]), {})[r["backend"]] = r.get("ms")
        gpus.add(r.get("gpu") or "(GPU not in the records)")
    rows = []
    for point in sweep12_points(p):
        ours = {}
        for step in p["steps"]:
            rec = in_results(where, _record_name(step, point["dtype"], point["head_dim"], point["seq"], point["causal"]))
            ours[step] = [json.loads(x) for x in file_lines(rec)] if os.path.isfile(rec) else []
        for rnd in range(p["rounds"]):
            theirs = sdpa.get((_point_key(point), rnd), {})
            row = dict(point, round=rnd, flash_ms=theirs.get("flash"), cudnn_ms=theirs.get("cudnn"))
            for name in ("flash", "cudnn"):
                ms = theirs.get(name)
                row[f"{name}_tflops"] = backward_flops(point) / ms * 1e-9 if ms else None
            for step, recs in ours.items():
                r = recs[rnd] if rnd < len(recs) else {}
                ms = r.get("median_ms")
                if r.get("date"):
                    dates.add(r["date"])
                row[f"step{step}_ms"] = ms
                row[f"step{step}_tflops"] = backward_flops(point) / ms * 1e-9 if ms else None
                row[f"step{step}_pass"] = r.get("pass")
                row[f"step{step}_over_cudnn"] = theirs["cudnn"] / ms if ms and theirs.get("cudnn") else None
                row[f"step{step}_over_flash"] = theirs["flash"] / ms if ms and theirs.get("flash") else None
            rows.append(row)
    with open(in_results(where, "stage12_sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["dtype"])
        w.writeheader()
        w.writerows(rows)
    with open(in_results(where, "stage12_sweep_table.txt"), "w") as f:
        title = f"{', '.join(sorted(gpus))}, {', '.join(sorted(dates))}: the backward alone, TFLOP/s (2.5 x 4 B H N^2 d, " \
                "halved for causal), median over rounds; /cudnn: SDPA cuDNN's time over ours (above 1: faster)\n\n"
        f.write(title + sweep12_table(rows, p["steps"]))


def sweep12_table(rows, steps) -> str:
    """One line per point: the median over rounds of each step's TFLOP/s and ratio to cuDNN (with the
    rounds' smallest and largest ratio), and SDPA flash's and cuDNN's TFLOP/s."""
    def med(xs):
        xs = sorted(x for x in xs if x is not None)
        return xs[len(xs) // 2] if xs else None

    def fmt(x, spec=".1f"):
        return "-" if x is None else format(x, spec)

    by_point = {}
    for r in rows:
        by_point.setdefault(_point_key(r), []).append(r)
    head = "dtype  d    N      causal  flash  cudnn" + "".join(f"  step{s} TFLOP/s  /cudnn (min-max)" for s in steps)
    lines = [head]
    for key, rs in by_point.items():
        line = f"{key[0]:5}  {key[1]:<4} {key[2]:<6} {str(key[3]):6}  {fmt(med(r['flash_tflops'] for r in rs)):>5}  " \
               f"{fmt(med(r['cudnn_tflops'] for r in rs)):>5}"
        for s in steps:
            ratios = [r[f"step{s}_over_cudnn"] for r in rs if r[f"step{s}_over_cudnn"] is not None]
            spread = f"({min(ratios):.2f}-{max(ratios):.2f})" if ratios else ""
            line += f"  {fmt(med(r[f'step{s}_tflops'] for r in rs)):>13}  {fmt(med(ratios), '.2f'):>6} {spread:11}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _sweep12_check(p):
    entries_match("dtypes", r"bf16|fp16", "bf16 or fp16")(p)
    entries_match("steps", r"[0-9]+d?", "step numbers (0: stage 09's default backward), with d for the deterministic order "
                  "(0d, 3d, 4d)")(p)
    if any(d not in (64, 128) for d in p["head_dims"]):
        raise ValueError(f"head_dims are 64 or 128, not {','.join(str(d) for d in p['head_dims'])}")
    if p["rounds"] < 1:
        raise ValueError(f"rounds is at least 1, not {p['rounds']}")


def _sweep12_summary(where: Where):
    """The table of medians over rounds (stage12_sweep_table.txt), else the points' verdicts."""
    table = in_results(where, "stage12_sweep_table.txt")
    return file_lines(table) if os.path.isfile(table) else grep(where.log, r"^problem|TFLOP/s|verdict|MISMATCH")[-80:]


SWEEP12 = Experiment(
    name="sweep12",
    stage="12",
    description="stage 12's backward, each step of its road (0: stage 09's default backward), beside SDPA flash's and "
                "cuDNN's backward in rounds; bf16/fp16, d 64/128, causal and not, B*N and H*d fixed as in the course's "
                "grid; one JSON record per point, step and round, stage12_sweep.csv and a table of medians",
    targets=("stage12_hopper_backward",),
    params={"steps": ("0", "1", "2", "3", "4", "4d"), "dtypes": ("bf16",), "head_dims": (64, 128), "sizes": (1024, 4096, 16384),
            "tokens": 16384, "width": 2048, "repeat": 20, "rounds": 3, "sdpa": True},
    param_help={
        "steps": "steps of the road (--step), 0 being stage 09's default backward; 4d: step 4 with --deterministic",
        "dtypes": "bf16, fp16 or both (--dtype)",
        "head_dims": "head dimensions, 64 and/or 128 (--head-dim)",
        "sizes": "sequence lengths N (--seq-q, --seq-k)",
        "tokens": "B*N: the batch is tokens / N",
        "width": "H*d: the heads are width / d",
        "repeat": "timed runs per point (--repeat; the median of at least 20 is the course's rule)",
        "rounds": "rounds over the grid, ours then SDPA's each round",
        "sdpa": "time SDPA flash's and cuDNN's backward on the same points (PyTorch on the GPU machine)",
    },
    commands=_sweep12_commands,
    outputs=("stage12_step{step}_{dtype}_d{d}_n{n}{_causal}.jsonl", "stage12_sdpa.jsonl", "stage12_sweep.csv",
             "stage12_sweep_table.txt"),
    summary=_sweep12_summary,
    check=_sweep12_check,
    finish=_sweep12_finish,
)

SANITIZE12 = sanitize.experiment("12", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 12 at "
                                       "every step of its road from 1: tails, Nq != Nk both ways, causal rows that see "
                                       "no key, bnhd, fp16, d 64 and 128")



def _ncu12_name(step, d) -> str:
    return f"ncu_stage12_step{step}_d{d}"


def _ncu12_commands(p, ctx):
    """One launch of the main kernel per step and d: bf16, N 4096, non-causal, B = 16384 / N and H = 2048 / d
    as in sweep12's grid; --repeat 1 --warmup 0 makes the first launch the one measured."""
    cmds = []
    for step in p["steps"]:
        for d in p["dims"]:
            point = {"dtype": "bf16", "head_dim": d, "seq": 4096, "causal": False, "batch": 4, "heads": 2048 // d}
            argv = _ours_argv(ctx, point, step, 1, os.path.join(ctx.results("ncu12"), f"bench_step{step}_d{d}.jsonl"), 0)
            cmds += ncu_command(ctx, "ncu12", "hopper_backward_kernel", _ncu12_name(step, d), NCU11_METRICS, argv)
    return cmds


def _ncu12_summary(where: Where):
    """Per step and d: the main kernel's time, throughputs, occupancy, registers, shared memory, then its
    tensor pipe (wgmma), spills and stalls."""
    return labelled_reports(where, [(f"-- step {step}, d={d}", _ncu12_name(step, d)) for step in where.params["steps"]
                                    for d in where.params["dims"]], NCU11_COUNTERS)


NCU12 = Experiment(
    name="ncu12",
    stage="12",
    description="Nsight Compute on stage 12's main kernel (hopper_backward_kernel), one launch per step and d: bf16, "
                "N 4096, non-causal, B 4, H 2048/d: tensor-pipe use (wgmma), occupancy, stall reasons, registers",
    targets=("stage12_hopper_backward",),
    params={"steps": (1, 2), "dims": (64, 128)},
    param_help={"steps": "steps of the road (1 and up: the Hopper kernel)", "dims": "head dimensions, one report each"},
    commands=_ncu12_commands,
    outputs=tuple(f"ncu_stage12_step{{step}}_d{{d}}{end}" for end in (".ncu-rep", ".csv", "_metrics.ncu-rep",
                                                                      "_metrics.csv")) + ("bench_step{step}_d{d}.jsonl",),
    summary=_ncu12_summary,
)

EXPERIMENTS = (TEST12, SWEEP12, SANITIZE12, NCU12)
