"""Stage 07's experiments (the pipelined fused kernel, bf16/fp16, mma.sync): its final kernel over
the full grid, and every step of its road, each beside PyTorch SDPA's flash and cuDNN backends.

Ported from the bash driver's steps `sweep07` and `road` with the same sdpa_compare.py
arguments; ROAD_SIZES and ROUNDS became the parameters `road.sizes` and `rounds`. Also ported:
`switches07`, `order07`, `ncu07`, `ncu07road` (NCU_ROAD_STEPS: its steps) and `sanitize`'s stages
07 and 07m (sanitize07, sanitize07m).
"""
from . import sanitize
from .experiment import Command, Experiment, Where, grep, in_results
from .ncu import (BENCH_NCU, KERNEL07, NCU07_METRICS, NCUROAD_METRICS, metric_lines, ncu_one, profile, raw_page,
                  report_lines)
from .tools import (COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, block_orders, compare, compare_summary, merge_with,
                    packed_lengths)


def _sweep07_commands(p, ctx):
    return [compare(ctx, "sweep07", p["rounds"], "--stages", "07", "--dtypes", "bf16", "fp16", *merge_with())]


SWEEP07 = Experiment(
    name="sweep07",
    stage="07",
    description="stage 07's final kernel in bf16 and fp16 beside SDPA flash and cuDNN, the full grid",
    targets=COMPARE_TARGETS,
    params={"rounds": 3},
    param_help={"rounds": ROUNDS_HELP},
    commands=_sweep07_commands,
    # gpu_sweep.csv keeps the other rows of docs/results/gpu_sweep.csv (--merge-with).
    outputs=COMPARE_OUTPUTS + ("stage07_sweep_table.txt", "ratios_over_rounds.txt"),
    summary=compare_summary,
)


def _road_commands(p, ctx):
    sizes = [str(n) for n in p["sizes"]]
    return [compare(ctx, "road", p["rounds"], "--stages", "07", "--dtypes", "bf16", "--steps", "all",
                    "--sizes", *sizes, "--head-dims", "64", "128", "--repeat", "20", "--warmup", "3")]


ROAD = Experiment(
    name="road",
    stage="07",
    description="stage 07, every step of its road and every tuning candidate, bf16, d 64/128, causal and not, "
                "beside SDPA flash and cuDNN",
    targets=COMPARE_TARGETS,  # the tuning candidates need the build's FA_STAGE07_TUNING=ON (the default)
    params={"sizes": (1024, 4096, 16384), "rounds": 3},
    param_help={"sizes": "sequence lengths N (--sizes; B*N = 16384, H*d = 2048)", "rounds": ROUNDS_HELP},
    commands=_road_commands,
    outputs=COMPARE_OUTPUTS + ("road.csv", "road.json", "stage07_road_table.txt", "stage07_sweep_table.txt",
                               "ratios_over_rounds.txt"),
    summary=compare_summary,
)



def _switches07_commands(p, ctx):
    out = ctx.results("switches07")
    lengths = packed_lengths()
    return [Command((ctx.exe("bench/bench_gpu"), "--stages", "07", "--dtypes", "bf16", "fp16", "--sizes", "4096", "16384",
                     "--head-dims", "64", "128", "--causal", "yes", "--model07", *p["models"], "--varlen07", lengths,
                     "--repeat", "20", "--warmup", "3", "--check", "false", "--json", f"{out}/switches07.json",
                     "--csv", f"{out}/switches07.csv"), stdout=f"{out}/switches07.txt",
                    header=(f"packed lengths: {lengths}",))]


def _switches07_summary(where: Where):
    """The packed lengths, then bench_gpu's stage10 rows (each switch against the plain causal kernel)."""
    return grep(in_results(where, "switches07.txt"), r"^packed lengths: |^stage10 ")


SWITCHES07 = Experiment(
    name="switches07",
    stage="07",
    description="stage 07 with stage 10's switches beside its plain causal kernel, bf16 and fp16, d 64/128, N 4096/16384: "
                "grouped heads 8:1 and 4:1, a 4096-key causal window, the soft cap, dropout 0.1; and a packed batch of "
                "mixed lengths (seed 7, 16384 tokens) beside a uniform batch of the same tokens",
    targets=("bench_gpu", "mma_ceiling"),
    params={"models": ("8/-1/0", "4/-1/0", "1/4095/0", "1/-1/0/50", "1/-1/0/0/0.1")},
    param_help={"models": "stage 10's switches, G/window/.../softcap/dropout (--model07)"},
    commands=_switches07_commands,
    outputs=("switches07.json", "switches07.csv", "switches07.txt"),
    summary=_switches07_summary,
)


def _order07_commands(p, ctx):
    lengths = packed_lengths()
    return block_orders(ctx, "order07", "FA_STAGE07_BLOCK_ORDER", p["orders"], p["rounds"],
                        ("--stages", "07", "--dtypes", "bf16", "fp16", "--sizes", "4096", "--head-dims", "64", "128",
                         "--causal", "yes", "--varlen07", lengths, "--repeat", "20", "--warmup", "3", "--check", "false"),
                        header=(f"packed lengths: {lengths}",))


def _order07_summary(where: Where):
    """Each round's block order and stage 07's packed rows (the lengths first)."""
    return grep(in_results(where, "order07.txt"), r"^packed lengths: |^== |^stage07 varlen")


ORDER07 = Experiment(
    name="order07",
    stage="07",
    description="stage 07's packed forward on stage 10's batch of mixed lengths, bf16 and fp16, d 64/128, causal, its "
                "blocks entry by entry with the heads innermost (the default) and head by head, rounds interleaved",
    targets=("bench_gpu", "mma_ceiling"),
    params={"orders": ("entries", "heads"), "rounds": 3},
    param_help={"orders": "FA_STAGE07_BLOCK_ORDER values, the default first", "rounds": "rounds of every order (ROUNDS)"},
    commands=_order07_commands,
    outputs=("order07.txt",),
    summary=_order07_summary,
)

SANITIZE07 = sanitize.experiment("07", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 07: "
                                       "small problems with tails, Nq != Nk, d 256, fp16, and its road's first step")
SANITIZE07M = sanitize.experiment("07m", "compute-sanitizer on stage 07's kernels with stage 10's switches, through "
                                         "test_stage07's cases: packed batches, grouped heads, windows, the soft cap, "
                                         "dropout")



def _ncu07_commands(p, ctx):
    cmds = []
    for d in p["dims"]:
        cmds += ncu_one(ctx, "ncu07", KERNEL07, f"ncu_stage07_d{d}", NCU07_METRICS, "--stages", "07", "--dtypes", "bf16",
                        "--sizes", "4096", "--head-dims", str(d), "--causal", "no")
    return cmds


def _ncu07_summary(where: Where):
    """Per d: the kernel's time, throughputs, occupancy, registers, shared memory, bank conflicts, then
    its tensor pipe, ex2, shared-memory traffic, ldmatrix, cp.async, spills and stalls."""
    lines = []
    for d in where.params["dims"]:
        lines += [f"-- d={d}"] + report_lines(
            where.results, f"ncu_stage07_d{d}", counters=r"hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|ldgsts|local_op|"
            r"registers|stalled_(barrier|long|short|mio|math|wait)")
    return lines


NCU07 = Experiment(
    name="ncu07",
    stage="07",
    description="Nsight Compute on stage 07's final kernel, bf16, N=4096 non-causal, d=64 (B=4 H=32) and d=128 "
                "(B=4 H=16), one launch each: the sections, then the counters",
    targets=("bench_gpu",),
    params={"dims": (64, 128)},
    param_help={"dims": "head dimensions, one report each"},
    commands=_ncu07_commands,
    outputs=("ncu_stage07_d{d}.ncu-rep", "ncu_stage07_d{d}.csv", "ncu_stage07_d{d}_metrics.ncu-rep",
             "ncu_stage07_d{d}_metrics.csv"),
    summary=_ncu07_summary,
)


def _ncu07road_commands(p, ctx):
    out, log = ctx.results("ncu07road"), ctx.log("ncu07road")
    metrics, cmds = ctx.known_metrics(NCUROAD_METRICS, log), []
    for s in p["steps"]:
        report = f"{out}/ncu_stage07_step{s}"
        cmds += [profile(("timeout", "300", "ncu", "--clock-control", "none", "-k", f"regex:{KERNEL07}", "--launch-count",
                          "1", "--metrics", metrics), report,
                         (ctx.exe("bench/bench_gpu"), "--stages", "07", "--dtypes", "bf16", "--steps", str(s), "--sizes",
                          "4096", "--head-dims", "64", "--causal", "no", *BENCH_NCU)),
                 raw_page(report, log)]
    return cmds


def _ncu07road_summary(where: Where):
    """Per step: its time, tensor pipe, bank conflicts, wavefronts, ldmatrix, shared loads and stores, cp.async."""
    lines = []
    for s in where.params["steps"]:
        lines += [f"-- step {s}"] + metric_lines(in_results(where, f"ncu_stage07_step{s}.csv"),
                                                 r"gpu__time|hmma|bank_conflicts|wavefronts|ldsm|shared_(ld|st)|ldgsts")
    return lines


NCU07ROAD = Experiment(
    name="ncu07road",
    stage="07",
    description="shared-memory bank conflicts of stage 07's road steps 1 (ldmatrix) and 2 (swizzle), bf16, d=64 N=4096 "
                "non-causal, under Nsight Compute's counters",
    targets=("bench_gpu",),
    params={"steps": (1, 2)},
    param_help={"steps": "steps of the road (--steps; NCU_ROAD_STEPS)"},
    commands=_ncu07road_commands,
    outputs=("ncu_stage07_step{s}.ncu-rep", "ncu_stage07_step{s}.csv"),
    summary=_ncu07road_summary,
)

EXPERIMENTS = (SWEEP07, ROAD, SWITCHES07, ORDER07, NCU07, NCU07ROAD, SANITIZE07, SANITIZE07M)
