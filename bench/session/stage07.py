"""Stage 07's experiments (the pipelined fused kernel, bf16/fp16, mma.sync): its final kernel over
the full grid, and every step of its road, each beside PyTorch SDPA's flash and cuDNN backends.

Ported from bench/gpu_session.sh's steps `sweep07` and `road` with the same sdpa_compare.py
arguments; ROAD_SIZES and ROUNDS became the parameters `road.sizes` and `rounds`.
"""
from .experiment import Experiment
from .tools import COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, compare, compare_summary, merge_with


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

EXPERIMENTS = (SWEEP07, ROAD)
