"""Stage 11's experiments (the Hopper forward: TMA, mbarrier rings, wgmma, warp specialization;
sm_90a): its road beside SDPA, its tests, its compiler traps, one block's timeline, and Nsight
Compute's counters at every step, and the first contact with a new Hopper GPU.

Ported from the bash driver's steps `road11`, `test11`, `traps11`, `timeline11` and
`ncu11road` with the same commands; their environment variables (ROAD11_STEPS, TIMELINE11_SHAPES,
NCU11_DIMS, ...) became the parameters below. `bringup11`, the first contact with a new Hopper
GPU, ports bench/hopper_first_contact.sh (2026-11-23, which took docs/results/stage11_first_contact*;
`git log -- bench/hopper_first_contact.sh`): STEPS, TIMED and BUDGET became its parameters, its build
the driver's (SKIP_BUILD=1: --no-build), its logic bench/bringup11.py.
"""
import csv
import glob
import json
import math
import os

import bringup11  # bench/bringup11.py: bench/ is on the path wherever the package `session` imports

from . import sanitize
from .ncu import (KERNEL11, NCU11_COUNTERS, NCU11_METRICS, labelled_reports, launch_lines, launches, ncu_command, ncu_one,
                  profile, raw_page, report_lines, report_outputs, side_by_side)
from .experiment import Command, Experiment, Glob, Where, entries_match, file_lines, grep, in_results, tail
from .runner import SessionError
from .tools import COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, compare, compare_summary, ctest_gpu, ctest_summary, yes_no

STAGE11 = "stages/11_hopper_kernel/stage11_hopper_kernel"


def _road11_commands(p, ctx):
    return [compare(ctx, "road11", p["rounds"], "--stages", "11", "--dtypes", *p["dtypes"], "--steps11", *p["steps"],
                    "--sizes", *(str(n) for n in p["sizes"]), "--head-dims", "64", "128", "--repeat", "20",
                    "--warmup", "3")]


def _check_road11(p):
    if any(d not in ("bf16", "fp16") for d in p["dtypes"]):
        raise ValueError(f"dtypes must be bf16 or fp16, not {','.join(p['dtypes'])}")
    _check_steps(p["steps"])


def _check_steps(steps):
    if steps != ("all",) and not all(s.isdigit() for s in steps):
        raise ValueError(f"steps must be all or step numbers (like 0,8,9), not {','.join(steps)}")


ROAD11 = Experiment(
    name="road11",
    stage="11",
    description="stage 11, every step of its road (step 0: stage 07's final kernel), d 64/128, causal and not, "
                "beside SDPA flash and cuDNN, each step checked against stage 07's final kernel",
    targets=COMPARE_TARGETS,
    params={"steps": ("all",), "dtypes": ("bf16",), "sizes": (1024, 4096, 16384), "rounds": 3},
    param_help={
        "steps": "steps of the road (--steps11): all, or numbers such as 0,8,9",
        "dtypes": "bf16, fp16 or both (--dtypes)",
        "sizes": "sequence lengths N (--sizes; B*N = 16384, H*d = 2048)",
        "rounds": ROUNDS_HELP,
    },
    commands=_road11_commands,
    outputs=COMPARE_OUTPUTS + ("road11.csv", "road11.json", "stage11_road_table.txt", "stage11_sweep_table.txt",
                               "ratios_over_rounds.txt"),
    summary=compare_summary,
    check=_check_road11,
)


def _test11_commands(p, ctx):
    return ctest_gpu(ctx, "hopper|stage11", p["timeout"])


TEST11 = Experiment(
    name="test11",
    stage="11",
    description="the tests of stage 11 and of Hopper's wrappers (ctest -R 'hopper|stage11'): host maps, wrappers, "
                "every step, the reading files bit for bit, the shared-memory map, the command line",
    targets=("make_npy_inputs", "stage11_hopper_kernel", "test_hopper_layouts", "test_hopper_wrappers", "test_stage11",
             "test_stage11_schedule", "test_stage11_smem_map", "test_stage11_steps", "wgmma_ceiling"),
    params={"timeout": 240},
    param_help={"timeout": "seconds before ctest fails one test (a hung barrier)"},
    commands=_test11_commands,
    outputs=(),  # CTest writes nothing but its log (WORK/logs/test11.log)
    summary=ctest_summary,
)


def _traps11_commands(p, ctx):
    out = ctx.results("traps11")
    return [Command(("python3", "bench/traps11.py", "--check", "--json", f"{out}/stage11_traps.json",
                     "--table", f"{out}/stage11_traps_table.txt"))]


def _traps11_summary(where: Where):
    """The table of traps and fixes (ptxas's messages, SASS counts) and traps11.py's verdict."""
    return file_lines(in_results(where, "stage11_traps_table.txt")) + tail(where.log, 1)


TRAPS11 = Experiment(
    name="traps11",
    stage="11",
    description="stage 11's compiler traps (bench/traps11.py): ptxas's messages and the SASS counts of each trap "
                "and its fix, checked",
    targets=(),  # traps11.py compiles traps.cu itself with nvcc
    params={},
    param_help={},
    commands=_traps11_commands,
    outputs=("stage11_traps.json", "stage11_traps_table.txt"),
    summary=_traps11_summary,
)


def _shape(spec: str):
    """'d:N:causal' (causal 0 or 1) as (d, N, causal, the records' name for it)."""
    d, n, causal = spec.split(":")
    return int(d), int(n), causal == "1", f"d{d}_n{n}" + ("_causal" if causal == "1" else "")


def _timeline11_commands(p, ctx):
    out, cmds = ctx.results("timeline11"), []
    for spec in p["shapes"]:
        d, n, causal, name = _shape(spec)
        for step in p["steps"]:
            cmds.append(Command((ctx.exe(STAGE11), "--batch", str(16384 // n), "--heads", str(2048 // d), "--seq-q", str(n),
                                 "--seq-k", str(n), "--head-dim", str(d), *(["--causal"] if causal else []),
                                 "--step", str(step), "--bench", "--repeat", "20", "--warmup", "3", "--reference", "never",
                                 "--timeline", f"{out}/stage11_timeline_{name}_step{step}.json")))
        cmds.append(Command(("python3", "docs/make_timeline.py", "--out", f"{out}/timeline_{name}.svg", "--table",
                             f"{out}/timeline_table_{name}.txt", Glob(f"{out}/stage11_timeline_{name}_step*.json"))))
    return cmds


def _timeline11_summary(where: Where):
    """Each shape's table of where each warpgroup's cycles went, then the log's timeline and failure lines."""
    lines = []
    for spec in where.params["shapes"]:
        lines += file_lines(in_results(where, f"timeline_table_{_shape(spec)[3]}.txt"))
    return lines + grep(where.log, r"^timeline:|FAIL|error")


TIMELINE11 = Experiment(
    name="timeline11",
    stage="11",
    description="stage 11's instrumented build: one thread block's marks (timeline.hpp) at several steps and "
                "shapes, bf16, each timed beside its plain build; docs/make_timeline.py draws and tabulates them",
    targets=("stage11_hopper_kernel",),
    params={"steps": (3, 4, 5, 8, 9, 10), "shapes": ("128:4096:0", "64:4096:0", "128:1024:0", "64:1024:1")},
    param_help={
        "steps": "steps of the road to record (--step)",
        "shapes": "d:N:causal, B*N = 16384, H*d = 2048 (the lesson reads d64/d128 N 4096 steps 3,4,5,8)",
    },
    commands=_timeline11_commands,
    outputs=("stage11_timeline_{shape}_step{step}.json", "timeline_{shape}.svg", "timeline_table_{shape}.txt"),
    summary=_timeline11_summary,
    check=entries_match("shapes", r"[0-9]+:[0-9]+:[01]", "d:N:causal with causal 0 or 1 (like 128:4096:0)"),
)


def _ncu11road_commands(p, ctx):
    out, log, n, cmds = ctx.results("ncu11road"), ctx.log("ncu11road"), p["size"], []
    metrics, names = ctx.known_metrics(NCU11_METRICS, log), []
    for d in p["dims"]:
        # bench_gpu's own CSV of the profiled run names each step (its timings under replays mean nothing).
        report, bench = f"{out}/ncu_stage11_road_d{d}", f"{out}/bench_gpu_d{d}"
        cmds += [profile(("timeout", "500", "ncu", "--clock-control", "none", "-k", f"regex:{KERNEL11}", "--metrics",
                          metrics), report,
                         (ctx.exe("bench/bench_gpu"), "--stages", "11", "--steps11", *p["steps"], "--dtypes", "bf16",
                          "--sizes", str(n), "--head-dims", str(d), "--causal", yes_no(p["causal"]), "--repeat", "1",
                          "--warmup", "0", "--check", "false", "--json", f"{bench}.json", "--csv", f"{bench}.csv")),
                 raw_page(report, log)]
        names += ["--names", f"{bench}.csv"]
    mask = "causal" if p["causal"] else "non-causal"
    head = (f"{ctx.gpu_name()}, {ctx.date()}: stage 11's road in Nsight Compute counters (bench/session.py ncu11road), "
            f"bf16, {mask}, B {16384 // n}, N {n}, H d = 2048, the first launch of each step")
    cmds.append(Command(("python3", "bench/ncu_steps11.py", "--csv", f"{out}/ncu_stage11_road.csv", *names,
                         *(f"{out}/ncu_stage11_road_d{d}.csv" for d in p["dims"])),
                        stdout=f"{out}/ncu_stage11_road.txt", header=(head,), stderr=log))
    return cmds


NCU11ROAD = Experiment(
    name="ncu11road",
    stage="11",
    description="Nsight Compute's counters at every step of stage 11's road, bf16, B*N = 16384, H*d = 2048: tensor "
                "pipe (wgmma), exp2, FMA/ALU, issue slots, registers, the epilogue's stores, stall reasons",
    targets=("bench_gpu",),
    params={"steps": ("all",), "dims": (64, 128), "size": 4096, "causal": False},
    param_help={
        "steps": "steps of the road (--steps11): all, or numbers",
        "dims": "head dimensions, one ncu run each",
        "size": "sequence length N",
        "causal": "a causal mask (--causal yes)",
    },
    commands=_ncu11road_commands,
    outputs=("ncu_stage11_road_d{d}.ncu-rep", "ncu_stage11_road_d{d}.csv", "bench_gpu_d{d}.csv", "bench_gpu_d{d}.json",
             "ncu_stage11_road.txt", "ncu_stage11_road.csv"),
    summary="ncu_stage11_road.txt",
    check=lambda p: _check_steps(p["steps"]),
)



def _groups11_commands(p, ctx):
    out, cmds, bench = ctx.results("groups11"), [], ctx.exe("bench/bench_gpu")
    for mib in p["mib"]:
        env = {"FA_STAGE11_GROUP_MIB": str(mib)}
        cmds.append(Command((bench, "--stages", "11", "--steps11", "5", "6", "--dtypes", "bf16", "--sizes", "1024", "4096",
                             "16384", "--head-dims", "64", "128", "--causal", "yes", "--repeat", "20", "--warmup", "3",
                             "--check", "false", "--json", f"{out}/sweep_{mib}.json", "--csv", f"{out}/sweep_{mib}.csv"),
                            env=env))
        for d in (64, 128):
            cmds.append(Command((bench, "--stages", "11", "--steps11", "5", "6", "--dtypes", "bf16", "--sizes", "4096",
                                 "--head-dims", str(d), "--causal", "yes", "--tokens", "4096", "--width", str(16 * d),
                                 "--repeat", "20", "--warmup", "3", "--check", "false", "--json", f"{out}/h16_{mib}_{d}.json",
                                 "--csv", f"{out}/h16_{mib}_{d}.csv"), env=env))
    return cmds


def _budget_name(m: int) -> str:
    return "all" if m >= 1 << 20 else f"{m} MiB"


def _groups11_rows(folder: str) -> list:
    """Stage 11's rows of every CSV of the folder, each with its budget (the file's second name part)."""
    rows = []
    for path in glob.glob(os.path.join(folder, "*.csv")):
        mib = int(os.path.basename(path).split("_")[1].split(".")[0])
        with open(path) as f:
            rows += [dict(r, mib=mib) for r in csv.DictReader(f) if r["impl"].startswith("stage11")]
    return rows


def groups11_table(folder: str):
    """(lines, best budget): per shape step 5's median TFLOP/s [min-max] and step 6's at each budget,
    the best over step 5; then each budget's geometric mean gain over the shapes (the bash driver's
    heredoc of groups11)."""
    rows, gains = _groups11_rows(folder), {}
    g, budgets = rows[0], sorted({r["mib"] for r in rows})
    out = [f"{g['gpu']}, {g['date']}: stage 11 under a causal mask, bf16, TFLOP/s (median of 20): step 5 "
           "(head by head, timed",
           "beside each budget), step 6 (heaviest first across groups of heads whose K and V fit the budget)",
           f"{'B':>3} {'H':>3} {'d':>4} {'N':>6}  {'step 5':>14}  "
           + "  ".join(f"{'6 @ ' + _budget_name(m):>12}" for m in budgets) + "   best/step 5"]
    shape = lambda r: (int(r["B"]), int(r["H"]), int(r["d"]), int(r["N"]))  # noqa: E731
    for key in sorted({shape(r) for r in rows}, key=lambda k: (k[0] == 1, k[2], k[3])):
        sel = [r for r in rows if shape(r) == key]
        s5 = sorted(float(r["tflops"]) for r in sel if r["step"] == "5")
        s6 = {r["mib"]: float(r["tflops"]) for r in sel if r["step"] == "6"}
        mid = s5[len(s5) // 2]
        out.append(f"{key[0]:>3} {key[1]:>3} {key[2]:>4} {key[3]:>6}  {mid:6.1f} [{s5[0]:.0f}-{s5[-1]:.0f}]  "
                   + "  ".join(f"{s6.get(m, float('nan')):12.1f}" for m in budgets) + f"   {max(s6.values()) / mid:.2f}")
        for m in budgets:
            gains.setdefault(m, []).append(s6.get(m, 0.0) / mid)
    mean = {m: math.exp(sum(math.log(max(x, 1e-9)) for x in gains[m]) / len(gains[m])) for m in budgets}
    out.append("step 6 / step 5, geometric mean over the shapes: "
               + ", ".join(f"{_budget_name(m)} {mean[m]:.3f}" for m in budgets))
    best = max(budgets, key=lambda m: mean[m])
    out.append(f"best budget: {_budget_name(best)}")
    return out, best


def _groups11_finish(p, ctx, where: Where):
    """groups11_table.txt and best_mib.txt from the CSVs of every budget (groups11_table())."""
    try:
        lines, best = groups11_table(where.results)
    except (KeyError, ValueError, IndexError, OSError) as e:
        raise SessionError(f"groups11_table: the CSVs of {where.results} could not be read: {e!r}") from None
    with open(in_results(where, "groups11_table.txt"), "w") as f:
        f.write("".join(line + "\n" for line in lines))
    with open(in_results(where, "best_mib.txt"), "w") as f:
        f.write(f"{best}\n")


GROUPS11 = Experiment(
    name="groups11",
    stage="11",
    description="stage 11's block order under a causal mask: step 5 (head by head) and step 6 (heaviest first across "
                "groups of heads) with several L2 budgets per group, bf16, d 64/128, N 1024/4096/16384 (B*N = 16384, "
                "H*d = 2048) and B 1, H 16, N 4096",
    targets=("bench_gpu",),
    params={"mib": (4, 16, 64, 1073741824)},
    param_help={"mib": "L2 budgets per group of heads, MiB (FA_STAGE11_GROUP_MIB; GROUP11_MIB; the largest: all heads)"},
    commands=_groups11_commands,
    outputs=("sweep_{mib}.json", "sweep_{mib}.csv", "h16_{mib}_{d}.json", "h16_{mib}_{d}.csv", "groups11_table.txt",
             "best_mib.txt"),
    summary="groups11_table.txt",
    finish=_groups11_finish,
)

SANITIZE11 = sanitize.experiment("11", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 11 at "
                                       "every step of its road from 1: tails, Nq != Nk both ways, causal rows that see "
                                       "no key, bnhd, fp16, d 64 and 128")
SANITIZE11R = sanitize.experiment("11r", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 11's "
                                         "reading files (steps/: steps 1-4 and 9) and their switch steps, through "
                                         "test_stage11_steps' two small problems per file, type and head dimension")


def _ncu11_commands(p, ctx):
    cmds = []
    for d in p["dims"]:
        # The first launch of the kernel is bench_gpu's untimed run of the final step.
        cmds += ncu_one(ctx, "ncu11", KERNEL11, f"ncu_stage11_d{d}", NCU11_METRICS, "--stages", "11", "--dtypes", "bf16",
                        "--sizes", "4096", "--head-dims", str(d), "--causal", "no")
    return cmds


def _ncu11_summary(where: Where):
    """Per d: the kernel's time, throughputs, occupancy, registers, shared memory, then its tensor pipe
    (wgmma), exp2, spills and stalls; the counters this ncu does not know."""
    return labelled_reports(where, [(f"-- d={d}", f"ncu_stage11_d{d}") for d in where.params["dims"]], NCU11_COUNTERS)


NCU11 = Experiment(
    name="ncu11",
    stage="11",
    description="Nsight Compute on stage 11's default kernel, bf16, N=4096 non-causal, d=64 (B=4 H=32) and d=128 "
                "(B=4 H=16), one launch each: tensor-pipe use (wgmma), stall reasons, registers",
    targets=("bench_gpu",),
    params={"dims": (64, 128)},
    param_help={"dims": "head dimensions, one report each"},
    commands=_ncu11_commands,
    outputs=report_outputs("ncu_stage11_d{d}"),
    summary=_ncu11_summary,
)


def _point(spec: str):
    """'d:N:causal' (causal yes or no) as (d, N, causal, the reports' name for it)."""
    d, n, causal = spec.split(":")
    return int(d), int(n), causal, f"d{d}_n{n}" + ("_causal" if causal == "yes" else "")


def _ncucudnn11_commands(p, ctx):
    """A generator: each point's cuDNN kernel is named by the listing its first command writes."""
    out, log = ctx.results("ncucudnn11"), ctx.log("ncucudnn11")
    for spec in p["points"]:
        d, n, causal, name = _point(spec)
        once = ("python3", "bench/sdpa_once.py", "--backend", "cudnn", "--forward-only", "--dtype", "bf16", "--seq", str(n),
                "--head-dim", str(d), *(("--causal",) if causal == "yes" else ()))
        listing, longest = f"{out}/cudnn_kernels_{name}", f"{out}/cudnn_longest_{name}.txt"
        # Every kernel the call launches, by its function name: the name the profile below filters on.
        yield profile(("timeout", "300", "ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum"), listing,
                      once)
        yield raw_page(listing, log, kernel_base="function")
        yield Command(("python3", "bench/ncu_side_by_side.py", "--longest", f"{listing}.csv"), stdout=longest)
        kernel = f"<the-kernel-named-in-cudnn_longest_{name}.txt>" if ctx.dry_run else "".join(file_lines(longest)).strip()
        if not kernel:
            yield Command(("test", "-s", longest))  # fails: no kernel found, as the script's status=1
            continue
        yield from ncu_one(ctx, "ncucudnn11", KERNEL11, f"ncu_stage11_{name}", NCU11_METRICS, "--stages", "11", "--dtypes",
                           "bf16", "--sizes", str(n), "--head-dims", str(d), "--causal", causal)
        yield from ncu_command(ctx, "ncucudnn11", f"^{kernel}$", f"ncu_cudnn_{name}", NCU11_METRICS, once)
        head = (f"stage 11's default kernel beside SDPA cuDNN's forward kernel (bench/session.py ncucudnn11), bf16, d {d}, "
                f"N {n}, causal {causal}, B N = 16384, H d = 2048, one launch each")
        yield side_by_side(ctx, "ncucudnn11", head, f"ncu_cudnn11_{name}.txt",
                           (f"stage11={out}/ncu_stage11_{name}_metrics.csv", f"cudnn={out}/ncu_cudnn_{name}_metrics.csv"))


def _ncucudnn11_summary(where: Where):
    """Per point: how many kernels cuDNN's forward launched and the longest, each report's launch,
    registers, shared memory and occupancy, then the side-by-side table."""
    lines = []
    for spec in where.params["points"]:
        name = _point(spec)[3]
        count = len(launches(in_results(where, f"cudnn_kernels_{name}.csv")))
        kernel = "".join(file_lines(in_results(where, f"cudnn_longest_{name}.txt"))).strip() or "none found"
        lines.append(f"-- {name}: cuDNN's forward launches {count} kernels; the longest: {kernel}")
        lines += launch_lines(where.results, f"ncu_stage11_{name}", f"ncu_cudnn_{name}")
        lines += file_lines(in_results(where, f"ncu_cudnn11_{name}.txt"))
    return lines


NCUCUDNN11 = Experiment(
    name="ncucudnn11",
    stage="11",
    description="Nsight Compute on stage 11's default kernel and on SDPA cuDNN's forward kernel (the longest it "
                "launches), bf16, at each point d:N:causal (B N = 16384, H d = 2048), the same counters side by side",
    targets=("bench_gpu",),
    params={"points": ("128:1024:no",)},
    param_help={"points": "d:N:causal points, causal yes or no (NCUCUDNN11)"},
    commands=_ncucudnn11_commands,
    outputs=("cudnn_kernels_{point}.ncu-rep", "cudnn_kernels_{point}.csv", "cudnn_longest_{point}.txt") + report_outputs(
        "ncu_stage11_{point}", "ncu_cudnn_{point}") + ("ncu_cudnn11_{point}.txt", "ncu_cudnn11_{point}.csv"),
    summary=_ncucudnn11_summary,
    check=entries_match("points", r"[0-9]+:[0-9]+:(yes|no)", "d:N:causal with causal yes or no (like 128:1024:no)"),
)


def _ncusource11_commands(p, ctx):
    out, log = ctx.results("ncusource11"), ctx.log("ncusource11")
    cmds, pages = [], []
    for spec in p["entries"]:
        step, d, n, causal = spec.split(":")
        steps = () if step == "default" else ("--steps11", step)  # bench_gpu times the default without --steps11
        name = f"s{step}_d{d}_n{n}_" + ("causal" if causal == "yes" else "full")
        rep = f"{out}/source11_{name}"
        cmds.append(profile(("timeout", "300", "ncu", "--clock-control", "none", "-k", f"regex:{KERNEL11}", "--launch-count",
                             "1", "--import-source", "yes", "--section", "SourceCounters", "--section", "WarpStateStats",
                             "--section", "LaunchStats"), rep,
                            (ctx.exe("bench/bench_gpu"), "--stages", "11", *steps, "--dtypes", "bf16", "--sizes", n,
                             "--head-dims", d, "--causal", causal, "--repeat", "1", "--warmup", "0", "--check", "false")))
        for kind, source in (("sass", "sass"), ("cuda", "cuda,sass")):
            cmds.append(Command(("ncu", "--import", f"{rep}.ncu-rep", "--page", "source", "--csv", "--print-source", source),
                                stdout=f"{out}/ncu_source11_{name}_{kind}.csv", stderr=log))
        pages.append(f"{name}={out}/ncu_source11_{name}_cuda.csv,{out}/ncu_source11_{name}_sass.csv")
    head = (f"{ctx.gpu_name()}, {ctx.date()}: stage 11 per source line (bench/session.py ncusource11), bf16, B*N = 16384, "
            "H*d = 2048, one launch each")
    return cmds + [Command(("python3", "bench/ncu_source_lines.py", *pages, "--top", "20", "--snippets",
                            "stages/11_hopper_kernel/kernel.cuh", "--csv", f"{out}/ncu_source11.csv"),
                           stdout=f"{out}/ncu_source11.txt", header=(head,))]


NCUSOURCE11 = Experiment(
    name="ncusource11",
    stage="11",
    description="stage 11's kernel under Nsight Compute's source counters, one launch per entry step:d:N:causal, bf16: "
                "warp samples by source line and by the kernel's snippets (bench/ncu_source_lines.py)",
    targets=("bench_gpu",),
    params={"entries": ("default:128:1024:no", "default:64:1024:no")},
    param_help={"entries": "step:d:N:causal launches, step default: the stage's default step (NCUSOURCE11)"},
    commands=_ncusource11_commands,
    outputs=("source11_{entry}.ncu-rep", "ncu_source11_{entry}_sass.csv", "ncu_source11_{entry}_cuda.csv",
             "ncu_source11.txt", "ncu_source11.csv"),
    summary="ncu_source11.txt",
    check=entries_match("entries", r"(default|[0-9]+):[0-9]+:[0-9]+:(yes|no)",
                        "step:d:N:causal (step a number or default, causal yes or no)"),
)


def _bringup11_commands(p, ctx):
    return [Command(("python3", "bench/bringup11.py", "--build", ctx.build, "--steps", ",".join(p["steps"]),
                     "--timed", ",".join(str(s) for s in p["timed"]), "--budget", str(p["budget"]),
                     "--out", ctx.results("bringup11"), "--log-name", os.path.basename(ctx.log("bringup11"))))]


def _check_bringup11(p):
    _check_steps(p["steps"])
    if p["budget"] < bringup11.LEAST_LEFT:
        raise ValueError(f"budget is at least {bringup11.LEAST_LEFT} seconds, not {p['budget']}")


def _bringup11_summary(where: Where):
    """The steps that finished, stage 11's SASS counts, each timed run's TFLOP/s and the ceilings
    (stage11_first_contact.json), then how the run ended: its time and what failed, hung or was skipped."""
    lines = grep(where.log, r"^(steps that finished|stage 11: [0-9]+ |other kernels: [0-9]+ |MISSING )")
    try:
        with open(in_results(where, bringup11.RECORD), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {}
    for r in record.get("runs", []):
        lines.append(f"step {r['step']} ({r['step_name']}) d {r['d']} N {r['N']} "
                     f"{'causal' if r['causal'] else 'non-causal'}: {r['tflops']:.1f} TFLOP/s")
    if record.get("ceilings"):
        lines.append("wgmma ceilings: " + ", ".join(f"{k} {v:.1f}" for k, v in record["ceilings"].items()) + " TFLOP/s")
    log = file_lines(where.log)
    end = max((i for i, line in enumerate(log) if line.startswith("=== done")), default=len(log))
    return lines + log[end:]


BRINGUP11 = Experiment(
    name="bringup11",
    stage="11",
    description="stage 11 on a new Hopper GPU from the smallest piece up (bench/bringup11.py): the SASS (HGMMA, "
                "registers), the host maps, each wrapper, each step on two small problems, a timing of the steps "
                "beside stage 07, the tests case by case, the wgmma ceiling; each command under a time limit (a hung "
                "step is left out of what follows), all under one budget",
    targets=tuple(bringup11.TARGETS),
    params={"steps": ("all",), "timed": (0, 3, 4, 5, 6, 7, 8), "budget": 170},
    param_help={
        "steps": "steps run on two small problems with FA_CUDA_SYNC=1 (STEPS): all (1 to the last its --help names), "
                 "or numbers; one killed at its 30 s limit is left out of the timing and the tests",
        "timed": "steps timed beside stage 07 (TIMED), bf16, B 1 H 16 N 4096, d 64/128, causal and not: those among "
                 "the steps that finished, and 0 (stage 07's kernel)",
        "budget": "seconds for the whole run, the build aside (BUDGET): a command's limit is cut to what is left, "
                  "and one that would start with less than 3 s left is skipped",
    },
    commands=_bringup11_commands,
    outputs=(bringup11.RECORD, bringup11.CEILINGS, "stage11_bench_step{step}_d{d}{_causal}.jsonl"),
    summary=_bringup11_summary,
    check=_check_bringup11,
)

EXPERIMENTS = (ROAD11, TEST11, TRAPS11, TIMELINE11, NCU11ROAD, NCU11, NCUCUDNN11, NCUSOURCE11, GROUPS11, SANITIZE11, SANITIZE11R,
               BRINGUP11)
