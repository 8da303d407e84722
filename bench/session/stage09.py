"""Stage 09's experiments (the backward kernel: dQ, dK, dV on tensor cores, atomic or
deterministic dQ), beside PyTorch SDPA's flash and cuDNN backends.

Ported from the bash driver's steps `sweep09` and `road09` with the same sdpa_compare.py
arguments; SWEEP09_STAGES, STEPS09, ROAD09_REPEAT and ROUNDS became parameters. road09 reads its
road's steps from stage09_backward_kernel --help, as the script did, so a new step is timed
without editing this file. Also ported: `order09`, `split09`, and `sanitize`'s stages 09 and 09m
(sanitize09, sanitize09m; SANITIZE09_STEPS and SANITIZE09M_CASES became their parameters), and the
Nsight Compute steps `ncu09`, `ncu09at`, `ncudrop`, `ncugqa`, `ncuflash09`, `ncusource09` and
`ncuvarlen09` (their NCU* variables became parameters).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: records.py
import records  # noqa: E402

from . import sanitize
from .experiment import Command, Experiment, Where, entries_match, file_lines, grep
from .ncu import (ATOMIC09, BENCH_NCU, DROPOUT_COLUMNS, GQA_COLUMNS, KERNEL07, KERNEL09, KERNEL09_TILED, NCU07_METRICS,
                  NCUDROP_METRICS, NCUGQA_METRICS, dropout_price, gqa_price, instance09, launch_lines, metric_lines,
                  ncu_command, ncu_one, profile, raw_page, report_lines, report_outputs, side_by_side, table_lines,
                  write_lines, write_table)
from .runner import SessionError
from .tools import (COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, STEPS09_HELP, block_orders, compare, compare_summary,
                    merge_with, steps09_args)

STAGE09 = "stages/09_backward_kernel/stage09_backward_kernel"


def _sweep09_commands(p, ctx):
    return [compare(ctx, "sweep09", p["rounds"], "--stages", *p["stages"], "--dtypes", *p["dtypes"],
                    "--sizes", *(str(n) for n in p["sizes"]), "--repeat", str(p["repeat"]), *steps09_args(p["steps09"]),
                    *merge_with())]


def _sweep09_check(p):
    entries_match("steps09", r"[0-9]+|none", "step numbers or none")(p)
    entries_match("dtypes", r"bf16|fp16", "bf16 or fp16")(p)


SWEEP09 = Experiment(
    name="sweep09",
    stage="09",
    description="stage 07's forward and stage 09's backward (atomic and deterministic dQ), bf16 and fp16, "
                "beside SDPA flash and cuDNN forward, backward and both, the full grid",
    targets=COMPARE_TARGETS,
    params={"stages": ("07", "09"), "dtypes": ("bf16", "fp16"), "sizes": (512, 1024, 2048, 4096, 8192, 16384),
            "steps09": ("1",), "repeat": 30, "rounds": 3},
    param_help={
        # Stage 07's forward runs again: the SDPA forward rows are measured again and 07 is compared with them.
        "stages": "stages compared (--stages); 07 with 09, as SDPA's forward rows are measured again",
        "dtypes": "16-bit types (--dtypes); one a call splits the grid over two calls",
        "sizes": "sequence lengths N (--sizes), B*N = 16384 tokens",
        "steps09": STEPS09_HELP,
        "repeat": "timed runs per point (--repeat; the median of at least 20 is the course's rule)",
        "rounds": ROUNDS_HELP,
    },
    check=_sweep09_check,
    commands=_sweep09_commands,
    # gpu_sweep.csv keeps the other rows of docs/results/gpu_sweep.csv (--merge-with).
    outputs=COMPARE_OUTPUTS + ("stage07_sweep_table.txt", "stage07_sweep_table.json", "stage09_sweep_table.txt",
                               "stage09_sweep_table.json", "ratios_over_rounds.txt", "ratios_over_rounds.json"),
    summary=compare_summary,
)


def road_steps(help_text: str):
    """(default step, last step) of stage 09's road from its --help:
    "--step INT:INT in [0 - 10]  which step of the road runs (default: step 9):"; None where it
    does not say."""
    last = re.search(r"--step INT:INT in \[0 - ([0-9]+)\]", help_text or "")
    default = re.search(r"--step .*\(default: step ([0-9]+)\)", help_text or "")
    return (int(default.group(1)) if default else None, int(last.group(1)) if last else None)


def _road09_steps(ctx):
    """The default step and the others, from the built executable's --help (placeholders in a dry run)."""
    default, last = road_steps(ctx.help_text(ctx.exe(STAGE09)))
    if ctx.dry_run and default is None:
        return "<default>", ["<every-other-step-of-stage09_backward_kernel--help>"]
    steps = [str(s) for s in range(0, (last if last is not None else -1) + 1) if s != default]
    if default is None or not steps:
        raise SessionError(f"could not read the road's steps from {ctx.exe(STAGE09)} --help")
    return str(default), steps


def _road09_commands(p, ctx):
    _, steps = _road09_steps(ctx)
    return [compare(ctx, "road09", p["rounds"], "--stages", "07", "09", "--dtypes", "bf16", "--sizes", "4096", "16384",
                    "--repeat", str(p["repeat"]), "--warmup", "2", "--steps09", *steps, "--steps09-backward-only")]


def _road09_finish(p, ctx, where: Where):
    """stage09_road09.txt: the sweep's table opened by two lines naming the command and the
    default step, the record docs/results/ keeps; and stage09_road09.json, the cells of its tables
    (bench/records.py) with the same two facts in the run's meta, which docs/ reads."""
    table = os.path.join(where.results, "stage09_sweep_table.txt")
    if not os.path.isfile(table):
        return
    default, _ = _road09_steps(ctx)
    command = f"python3 bench/session.py run road09 --set road09.rounds={p['rounds']}"
    with open(table) as f:
        body = f.read()
    with open(os.path.join(where.results, "stage09_road09.txt"), "w") as f:
        f.write(f"{command} (each round ours then SDPA); B*N = 16384, H*d = 2048.\n")
        f.write(f"In this run the default main kernel (rows stage09) was step {default}; the step tables give every "
                "other step beside it (/09), each timed by its backward with atomic dQ alone.\n")
        f.write(body)
    cells = os.path.splitext(table)[0] + ".json"
    if os.path.isfile(cells):
        run = records.read_tables(cells)
        run.meta.update(command=command, default_steps=dict(run.meta.get("default_steps", {}), **{"09": int(default)}))
        records.write_tables(os.path.join(where.results, "stage09_road09.json"), run)


def _road09_summary(where: Where):
    """sdpa_compare.py's failed points and tables, and where the record is."""
    note = ["road09: the record is road09/stage09_road09.txt (docs/results/stage09_road09.txt)"] \
        if os.path.isfile(os.path.join(where.results, "stage09_road09.txt")) else []
    return compare_summary(where) + note


ROAD09 = Experiment(
    name="road09",
    stage="09",
    description="stage 09's whole road in one run: the default main kernel with every other step beside it "
                "(each timed by its backward with atomic dQ alone), bf16, d 64/128, N 4096/16384, causal and not, "
                "beside SDPA flash and cuDNN (three rounds: about 400 s on an H200; give it a call of its own)",
    targets=COMPARE_TARGETS + ("stage09_backward_kernel",),  # its --help names the road's steps
    params={"repeat": 10, "rounds": 3},
    param_help={"repeat": "timed runs per point (--repeat)", "rounds": ROUNDS_HELP},
    commands=_road09_commands,
    outputs=COMPARE_OUTPUTS + ("stage09_sweep_table.txt", "stage09_sweep_table.json", "ratios_over_rounds.txt",
                               "ratios_over_rounds.json", "stage09_road09.txt", "stage09_road09.json"),
    summary=_road09_summary,
    finish=_road09_finish,
)



def _order09_commands(p, ctx):
    return block_orders(ctx, "order09", "FA_STAGE09_BLOCK_ORDER", p["orders"], p["rounds"],
                        ("--stages", "07", "09", "--dtypes", "bf16", "--sizes", "4096", "16384", "--head-dims", "64", "128",
                         "--causal", "yes", "--model07", "8/-1/0", "4/-1/0", "--repeat", "10", "--warmup", "3",
                         "--check", "false"))


def _order09_summary(where: Where):
    """Each round's block order and the grouped-head rows (stage10 ...)."""
    return grep(os.path.join(where.results, "order09.txt"), r"^== |^stage10 ")


ORDER09 = Experiment(
    name="order09",
    stage="09",
    description="stage 09's backward with grouped heads (8:1, 4:1) under a causal mask, bf16, d 64/128, N 4096/16384, "
                "its blocks longest loops first (the default) and head by head, rounds interleaved",
    targets=("bench_gpu", "mma_ceiling"),
    params={"orders": ("key-blocks", "heads"), "rounds": 3},
    param_help={"orders": "FA_STAGE09_BLOCK_ORDER values, the default first", "rounds": "rounds of every order (ROUNDS)"},
    commands=_order09_commands,
    outputs=("order09.txt",),
    summary=_order09_summary,
)


def _split09_commands(p, ctx):
    out, cmds = os.path.join(ctx.results("split09"), "split09.txt"), []
    for r in range(1, p["rounds"] + 1):
        for group in p["groups"]:
            for split in p["splits"]:
                if split > 0 and group % split:
                    continue  # the stage refuses a split that does not divide the group
                cmds.append(Command((ctx.exe("bench/bench_gpu"), "--stages", "07", "09", "--dtypes", "bf16", "--sizes",
                                     "4096", "16384", "--head-dims", "64", "128", "--causal", "yes", "--model07",
                                     f"{group}/-1/0", "--repeat", "10", "--warmup", "3", "--check", "false"),
                                    env={"FA_STAGE09_GROUP_SPLIT": str(split)}, stdout=out, append=True,
                                    header=(f"== round {r}, group {group}:1, group split {split}",)))
    return cmds


def _split09_summary(where: Where):
    """Each round's group and split and the grouped-head rows (stage10 ...)."""
    return grep(os.path.join(where.results, "split09.txt"), r"^== |^stage10 ")


SPLIT09 = Experiment(
    name="split09",
    stage="09",
    description="stage 09's backward with grouped heads (8:1, 4:1) under a causal mask, bf16, d 64/128, N 4096/16384, "
                "each group of query heads split over S blocks (FA_STAGE09_GROUP_SPLIT; 0: the rule), rounds interleaved",
    targets=("bench_gpu", "mma_ceiling"),
    params={"groups": (8, 4), "splits": (1, 2, 4, 8, 0), "rounds": 3},
    param_help={"groups": "query heads per K/V head (--model07 G/-1/0)",
                "splits": "FA_STAGE09_GROUP_SPLIT values, those dividing the group (0: launch.cuh's rule)",
                "rounds": "rounds of every split (ROUNDS)"},
    commands=_split09_commands,
    outputs=("split09.txt",),
    summary=_split09_summary,
)

SANITIZE09 = sanitize.experiment("09", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 09's "
                                       "backward: tails, Nq != Nk, both layouts, both dQ modes, fp16, at every main "
                                       "kernel of its road")
SANITIZE09M = sanitize.experiment("09m", "compute-sanitizer on stage 09's kernels with stage 10's switches, through "
                                         "test_stage09's cases: grouped heads, windows, the soft cap, packed batches, "
                                         "dropout, the group split")


METRICS09 = (r"hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|ldgsts|local_op|registers|"
             r"stalled_(barrier|long|short|mio|math|wait)")
# Steps 2 and 3 differ from step 1 only at d = 128: their instances there, as Nsight Compute demangles them.
STEP_INSTANCES09 = {2: r"[^<]*TiledFeatures<\(int\)64, \(int\)128,", 3: r".*WithDpPieces<"}


def _shape09(d):
    return ("--dtypes", "bf16", "--sizes", "4096", "--head-dims", str(d), "--causal", "no")


def _ncu09_commands(p, ctx):
    cmds, bench = [], ctx.exe("bench/bench_gpu")
    for d in (64, 128):
        # Step 0's kernel runs only as --steps09 0, whose first launch is the deterministic one: the atomic instance.
        cmds += ncu_one(ctx, "ncu09", rf"{KERNEL09}<.*{ATOMIC09}", f"ncu_stage09_d{d}", NCU07_METRICS, "--stages", "09",
                        "--steps09", "0", *_shape09(d), base="demangled")
        # How the backward's time splits between its three kernels: the first launch of each.
        split = f"{ctx.results('ncu09')}/ncu_stage09_split_d{d}"
        cmds += [profile(("timeout", "300", "ncu", "--clock-control", "none", "-k",
                          f"regex:backward_preprocess_kernel|{KERNEL09_TILED}|backward_postprocess_kernel",
                          "--launch-count", "3", "--metrics", "gpu__time_duration.sum"), split,
                         (bench, "--stages", "09", *_shape09(d), *BENCH_NCU)),
                 raw_page(split, ctx.log("ncu09"))]
        # Step 1's warp-tiled kernel; at d = 128 its instance with 128 x 64 blocks, by its template arguments.
        tiled = rf"{KERNEL09_TILED}<[^<]*TiledFeatures<\(int\)128, \(int\)64,.*{ATOMIC09}" if d == 128 else KERNEL09_TILED
        cmds += ncu_one(ctx, "ncu09", tiled, f"ncu_stage09_tiled_d{d}", NCU07_METRICS, "--stages", "09", "--steps09", "1",
                        *_shape09(d), base="demangled" if d == 128 else "function")
    for step in p["steps"]:
        regex = rf"{KERNEL09_TILED}<{STEP_INSTANCES09[step]}.*{ATOMIC09}"
        cmds += ncu_one(ctx, "ncu09", regex, f"ncu_stage09_step{step}_d128", NCU07_METRICS, "--stages", "09", "--steps09",
                        str(step), *_shape09(128), base="demangled")
    return cmds


def _ncu09_summary(where: Where):
    """Per d: step 0's kernel (report and counters), the backward's three kernels' times, step 1's
    warp-tiled kernel; then steps 2 and 3 at d = 128."""
    lines, r = [], where.results
    for d in (64, 128):
        lines += [f"-- d={d}"] + report_lines(r, f"ncu_stage09_d{d}", counters=METRICS09)
        lines += metric_lines(os.path.join(r, f"ncu_stage09_split_d{d}.csv"), ("gpu__time_duration.sum",))
        lines += [f"-- step 1 (warp-tiled), d={d}"] + report_lines(
            r, f"ncu_stage09_tiled_d{d}",
            counters=r"hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|registers|stalled_(barrier|long|short|mio|math|wait)")
    for step in where.params["steps"]:
        lines += [f"-- step {step}, d=128"] + report_lines(
            r, f"ncu_stage09_step{step}_d128", counters=r"hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|local_op|registers|"
            r"stalled_(barrier|long|short|mio|math|wait)")
    return lines


def _check_ncu09(p):
    if any(s not in STEP_INSTANCES09 for s in p["steps"]):
        raise ValueError(f"steps are 2 and/or 3 (their instances at d 128), not {','.join(map(str, p['steps']))}")


NCU09 = Experiment(
    name="ncu09",
    stage="09",
    description="Nsight Compute on stage 09's main backward kernel of step 0 (atomic dQ), bf16, d 64 and 128, N 4096, "
                "the time of each of the backward's three kernels, the warp-tiled kernel of step 1, steps 2 and 3 at d 128",
    targets=("bench_gpu",),
    params={"steps": (2, 3)},
    param_help={"steps": "steps of the warp-tiled kernel also reported at d 128 (NCU09_STEPS)"},
    commands=_ncu09_commands,
    outputs=report_outputs("ncu_stage09_d{d}", "ncu_stage09_tiled_d{d}", "ncu_stage09_step{s}_d128") + (
        "ncu_stage09_split_d{d}.ncu-rep", "ncu_stage09_split_d{d}.csv"),
    summary=_ncu09_summary,
    check=_check_ncu09,
)


def _at(spec):
    step, d = spec.split(":")
    return int(step), int(d)


def _ncu09at_commands(p, ctx):
    cmds = []
    for step, d in map(_at, p["at"]):
        cmds += ncu_one(ctx, "ncu09at", instance09(step, d), f"ncu_stage09_step{step}_d{d}", NCU07_METRICS, "--stages", "09",
                        "--steps09", str(step), *_shape09(d), base="demangled")
    return cmds


def _ncu09at_summary(where: Where):
    """Per step:d: the kernel's time, occupancy, registers, shared memory, bank conflicts, then its counters."""
    lines = []
    for step, d in map(_at, where.params["at"]):
        lines += [f"-- step {step}, d={d}"] + report_lines(
            where.results, f"ncu_stage09_step{step}_d{d}", counters=r"hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|"
            r"local_op|registers|stalled_(barrier|long|short|mio|math|wait|lg)|_red")
    return lines


NCU09AT = Experiment(
    name="ncu09at",
    stage="09",
    description="Nsight Compute on stage 09's warp-tiled kernel at each step:d, bf16, N=4096 non-causal, atomic dQ, "
                "one launch each",
    targets=("bench_gpu",),
    params={"at": ("2:64", "4:64", "5:64")},
    param_help={"at": "step:d points (NCU09_AT)"},
    commands=_ncu09at_commands,
    outputs=report_outputs("ncu_stage09_step{s}_d{d}"),
    summary=_ncu09at_summary,
    check=entries_match("at", r"[0-9]+:[0-9]+", "step:d (like 2:64)"),
)

_DROP_REPORT = ("gpu__time_duration.sum", "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active")
_DROP_METRICS = (r"duration|hmma|pipe_(fma|alu|xu|lsu)|issue_active|inst_executed.sum|"
                 r"stalled_(math|wait|short|mio|not_selected)")


def _ncudrop_runs(p):
    """(kernel label, report name, regex, bench_gpu's options) of each run, in the script's order."""
    for d in p["dims"]:
        for prob in ("0", "0.1"):
            # p = 0: the plain causal kernels; p = 0.1: the Dropped instances (--model07 1/-1/0/0/0.1).
            model = () if prob == "0" else ("--model07", f"1/-1/0/0/{prob}")
            dropped = "" if prob == "0" else ".*Dropped"
            shape = ("--dtypes", "bf16", "--sizes", "4096", "--head-dims", str(d), "--causal", "yes", *model)
            yield (f"stage 07 forward, d={d}, p={prob}", f"ncu_stage07_dropout{prob}_d{d}", f"{KERNEL07}<{dropped}",
                   ("--stages", "07", *shape))
            yield (f"stage 09 backward, d={d}, p={prob}", f"ncu_stage09_dropout{prob}_d{d}",
                   f"{KERNEL09_TILED}<{dropped}.*{ATOMIC09}", ("--stages", "07", "09", *shape))


def _ncudrop_commands(p, ctx):
    cmds = []
    for _, name, regex, args in _ncudrop_runs(p):
        cmds += ncu_one(ctx, "ncudrop", regex, name, NCUDROP_METRICS, *args, base="demangled")
    return cmds


def _ncudrop_finish(p, ctx, where: Where):
    """dropout_price.txt and .csv: per kernel and d, p 0 against p 0.1 (ncu.dropout_price)."""
    rows = dropout_price(where.results)
    write_table(os.path.join(where.results, "dropout_price.csv"), DROPOUT_COLUMNS, rows)
    write_lines(os.path.join(where.results, "dropout_price.txt"), [
        f"{ctx.gpu_name()}, {ctx.date()}: dropout's price in Nsight Compute (bench/session.py ncudrop), bf16, causal, "
        "B 4, N 4096, H d = 2048, one launch each", *table_lines(DROPOUT_COLUMNS, rows)])


def _ncudrop_summary(where: Where):
    """Per run: time, registers, occupancy and the pipes' counters; then the table of dropout's price."""
    lines = []
    for label, name, _, _ in _ncudrop_runs(where.params):
        lines += [f"-- {label}"] + report_lines(where.results, name, _DROP_REPORT, _DROP_METRICS)
    return lines + file_lines(os.path.join(where.results, "dropout_price.txt"))


NCUDROP = Experiment(
    name="ncudrop",
    stage="09",
    description="Nsight Compute on dropout's price: stage 07's forward and stage 09's backward (atomic dQ), causal, bf16, "
                "N 4096, p 0 and 0.1: pipes, issue slots, stalls",
    targets=("bench_gpu",),
    params={"dims": (64, 128)},
    param_help={"dims": "head dimensions (NCUDROP_DIMS)"},
    commands=_ncudrop_commands,
    outputs=report_outputs("ncu_stage{07,09}_dropout{p}_d{d}") + ("dropout_price.txt", "dropout_price.csv"),
    summary=_ncudrop_summary,
    finish=_ncudrop_finish,
)

GQA_GROUPS = ("plain", "4", "8")


def _gqa_what(stage):
    """(kernel regex, what, bench_gpu's stages, table) of ncugqa's stage."""
    if stage == "07":
        return f"{KERNEL07}<", "stage 07's forward kernel", ("07",), "gqa_price07.txt"
    return f"{KERNEL09_TILED}<", "stage 09's main backward kernel (atomic dQ)", ("07", "09"), "gqa_price.txt"


def _ncugqa_commands(p, ctx):
    kernel, _, stages, _ = _gqa_what(p["stage"])
    cmds = []
    for g in GQA_GROUPS:
        # The plain call's first launch is the plain instance; a grouped call's is a ModelFeatures one.
        model = () if g == "plain" else ("--model07", f"{g}/-1/0")
        regex = kernel + ("" if g == "plain" else ".*ModelFeatures") + (f".*{ATOMIC09}" if p["stage"] == "09" else "")
        cmds += ncu_one(ctx, "ncugqa", regex, f"ncu_stage{p['stage']}_gqa{g}_d{p['dim']}", NCUGQA_METRICS, "--stages",
                        *stages, "--dtypes", "bf16", "--sizes", str(p["n"]), "--head-dims", str(p["dim"]), "--causal",
                        "yes", *model, base="demangled")
    return cmds


def _ncugqa_finish(p, ctx, where: Where):
    """gqa_price.txt and .csv (09) or gqa_price07.txt and .csv (07): per group, ncu.gqa_price()."""
    _, what, _, table = _gqa_what(p["stage"])
    rows = gqa_price(where.results, p["stage"], p["dim"], GQA_GROUPS)
    write_table(os.path.join(where.results, os.path.splitext(table)[0] + ".csv"), GQA_COLUMNS, rows)
    write_lines(os.path.join(where.results, table), [
        f"{ctx.gpu_name()}, {ctx.date()}: {what}, causal, bf16, d {p['dim']}, N {p['n']}, H d = 2048 "
        "(bench/session.py ncugqa), one launch each", *table_lines(GQA_COLUMNS, rows)])


def _ncugqa_summary(where: Where):
    """The table of the grouped heads' price: time, instructions, pipes, the SMs' balance, stalls, L2, DRAM."""
    return file_lines(os.path.join(where.results, _gqa_what(where.params["stage"])[3]))


def _check_ncugqa(p):
    if p["stage"] not in ("07", "09"):
        raise ValueError(f"stage is 07 or 09, not {p['stage']}")


NCUGQA = Experiment(
    name="ncugqa",
    stage="09",
    description="Nsight Compute on the grouped heads' price in stage 09's main backward kernel (or stage 07's forward), "
                "causal, bf16: plain, 4:1 and 8:1 groups, with the SMs' busiest and average cycles, L2 hits, DRAM bytes",
    targets=("bench_gpu",),
    params={"stage": "09", "dim": 128, "n": 16384},
    param_help={"stage": "09 (the backward) or 07 (the forward) (NCUGQA_STAGE)", "dim": "head dimension (NCUGQA_DIM)",
                "n": "sequence length (NCUGQA_N)"},
    commands=_ncugqa_commands,
    outputs=report_outputs("ncu_stage{NN}_gqa{g}_d{d}") + ("gqa_price{,07}.txt", "gqa_price{,07}.csv"),
    summary=_ncugqa_summary,
    finish=_ncugqa_finish,
    check=_check_ncugqa,
)


def _ncuflash09_commands(p, ctx):
    cmds, cols, n = [], [], p["n"]
    for d in p["dims"]:
        cmds += ncu_one(ctx, "ncuflash09", f"{KERNEL09_TILED}<.*{ATOMIC09}", f"ncu_stage09_ours_d{d}", NCUDROP_METRICS,
                        "--stages", "09", "--dtypes", "bf16", "--sizes", str(n), "--head-dims", str(d), "--causal", "no",
                        base="demangled")
        cmds += ncu_command(ctx, "ncuflash09", "flash_bwd_dq_dk_dv", f"ncu_flash_bwd_d{d}", NCUDROP_METRICS,
                            ("python3", "bench/sdpa_once.py", "--backend", "flash", "--dtype", "bf16", "--seq", str(n),
                             "--head-dim", str(d)))
        out = ctx.results("ncuflash09")
        cols += [f"ours_d{d}={out}/ncu_stage09_ours_d{d}_metrics.csv", f"flash_d{d}={out}/ncu_flash_bwd_d{d}_metrics.csv"]
    head = (f"stage 09's default backward kernel beside SDPA flash's (bench/session.py ncuflash09), bf16, N {n}, "
            "non-causal, B N = 16384, H d = 2048, one launch each")
    return cmds + [side_by_side(ctx, "ncuflash09", head, "ncu_flash09.txt", cols)]


def _ncuflash09_summary(where: Where):
    """Each report's launch, registers, shared memory and occupancy, then the side-by-side table."""
    lines = []
    for d in where.params["dims"]:
        lines += launch_lines(where.results, f"ncu_stage09_ours_d{d}", f"ncu_flash_bwd_d{d}")
    return lines + file_lines(os.path.join(where.results, "ncu_flash09.txt"))


NCUFLASH09 = Experiment(
    name="ncuflash09",
    stage="09",
    description="Nsight Compute on stage 09's default backward kernel (atomic dQ) and on SDPA flash's "
                "(FlashAttention-2's bwd kernel, through bench/sdpa_once.py), bf16, non-causal, the same counters "
                "side by side",
    targets=("bench_gpu",),
    params={"n": 4096, "dims": (64, 128)},
    param_help={"n": "sequence length (NCUFLASH_N)", "dims": "head dimensions (NCUFLASH_DIMS)"},
    commands=_ncuflash09_commands,
    outputs=report_outputs("ncu_stage09_ours_d{d}", "ncu_flash_bwd_d{d}") + ("ncu_flash09.txt", "ncu_flash09.csv"),
    summary=_ncuflash09_summary,
)


def _default_step(ctx):
    """Stage 09's default main kernel's step, from its --help (a placeholder in a dry run)."""
    default, _ = road_steps(ctx.help_text(ctx.exe(STAGE09)))
    if default is None:
        if ctx.dry_run:
            return "<default>"
        raise SessionError(f"could not read the default step from {ctx.exe(STAGE09)} --help")
    return str(default)


def _ncusource09_commands(p, ctx):
    d, default, out = p["d"], _default_step(ctx), ctx.results("ncusource09")
    cmds = []
    for name in ("packed", "dense"):
        regex = f"{KERNEL09_TILED}<.*Packed<.*{ATOMIC09}" if name == "packed" else instance09(default, d)
        report = f"{out}/source09_{name}"
        cmds += [profile(("timeout", "300", "ncu", "--clock-control", "none", "--kernel-name-base", "demangled", "-k",
                          f"regex:{regex}", "--launch-count", "1", "--section", "SourceCounters", "--section",
                          "LaunchStats"), report,
                         (ctx.exe("bench/bench_gpu"), "--stages", "07", "09", "--dtypes", "bf16", "--sizes", "4096",
                          "--head-dims", str(d), "--causal", "yes", "--varlen07", "4096,4096,4096,4096", "--repeat", "1",
                          "--warmup", "0", "--check", "false")),
                 Command(("ncu", "--import", f"{report}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"),
                         stdout=f"{out}/ncu_source09_{name}.csv", stderr=ctx.log("ncusource09"))]
    head = (f"{ctx.gpu_name()}, {ctx.date()}: stage 09's backward on four 4096-token sequences, packed, beside the dense "
            "kernel", f"(step {default}) on the same tokens, bf16, d = {d}, causal, atomic dQ, one launch each "
            "(bench/session.py ncusource09)", "")
    return cmds + [Command(("python3", "bench/ncu_source_diff.py", "--csv", f"{out}/ncu_source09.csv",
                            f"packed={out}/ncu_source09_packed.csv", f"dense={out}/ncu_source09_dense.csv"),
                           stdout=f"{out}/ncu_source09.txt", header=head)]


NCUSOURCE09 = Experiment(
    name="ncusource09",
    stage="09",
    description="stage 09's packed backward beside the dense one on four 4096-token sequences, bf16, causal: Nsight "
                "Compute's instructions and warp samples per SASS opcode (bench/ncu_source_diff.py)",
    targets=("bench_gpu", "stage09_backward_kernel"),  # its --help names the default step
    params={"d": 64},
    param_help={"d": "head dimension (NCUSOURCE_D)"},
    commands=_ncusource09_commands,
    outputs=("source09_{packed,dense}.ncu-rep", "ncu_source09_packed.csv", "ncu_source09_dense.csv", "ncu_source09.txt",
             "ncu_source09.csv"),
    summary="ncu_source09.txt",
)


def _ncuvarlen09_commands(p, ctx):
    default, out, cmds, cols = _default_step(ctx), ctx.results("ncuvarlen09"), [], []
    for d in p["dims"]:
        # The packed rows run before the sweep: the first Packed launch is the packed batch's, the
        # first plain launch of the default step the dense batch's.
        args = ("--stages", "07", "09", "--dtypes", "bf16", "--sizes", "4096", "--head-dims", str(d), "--causal", "yes",
                "--varlen07", p["lengths"])
        cmds += ncu_one(ctx, "ncuvarlen09", f"{KERNEL09_TILED}<.*Packed<.*{ATOMIC09}", f"ncu_stage09_packed_d{d}",
                        NCUDROP_METRICS, *args, base="demangled")
        cmds += ncu_one(ctx, "ncuvarlen09", instance09(default, d), f"ncu_stage09_dense_d{d}", NCUDROP_METRICS, *args,
                        base="demangled")
        cols += [f"packed_d{d}={out}/ncu_stage09_packed_d{d}_metrics.csv",
                 f"dense_d{d}={out}/ncu_stage09_dense_d{d}_metrics.csv"]
    head = (f"stage 09's backward on a packed batch ({p['lengths']}) beside the dense kernel on the same tokens "
            "(bench/session.py ncuvarlen09), bf16, causal, one launch each")
    return cmds + [side_by_side(ctx, "ncuvarlen09", head, "ncu_varlen09.txt", cols)]


def _ncuvarlen09_summary(where: Where):
    """Each report's launch, registers, shared memory and occupancy, then the side-by-side table."""
    lines = []
    for d in where.params["dims"]:
        lines += launch_lines(where.results, f"ncu_stage09_packed_d{d}", f"ncu_stage09_dense_d{d}")
    return lines + file_lines(os.path.join(where.results, "ncu_varlen09.txt"))


NCUVARLEN09 = Experiment(
    name="ncuvarlen09",
    stage="09",
    description="stage 09's backward (atomic dQ) on a packed batch of equal lengths beside the dense kernel on the same "
                "tokens, Nsight Compute, bf16, causal",
    targets=("bench_gpu", "stage09_backward_kernel"),  # its --help names the default step
    params={"lengths": "4096,4096,4096,4096", "dims": (64, 128)},
    param_help={"lengths": "the packed batch's lengths, one word (--varlen07; NCUVARLEN_LENGTHS)",
                "dims": "head dimensions (NCUVARLEN_DIMS)"},
    commands=_ncuvarlen09_commands,
    outputs=report_outputs("ncu_stage09_packed_d{d}", "ncu_stage09_dense_d{d}") + ("ncu_varlen09.txt",
                                                                                 "ncu_varlen09.csv"),
    summary=_ncuvarlen09_summary,
)

EXPERIMENTS = (SWEEP09, ROAD09, ORDER09, SPLIT09, NCU09, NCU09AT, NCUDROP, NCUGQA, NCUFLASH09, NCUSOURCE09, NCUVARLEN09,
               SANITIZE09, SANITIZE09M)
