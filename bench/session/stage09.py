"""Stage 09's experiments (the backward kernel: dQ, dK, dV on tensor cores, atomic or
deterministic dQ), beside PyTorch SDPA's flash and cuDNN backends.

Ported from bench/gpu_session.sh's steps `sweep09` and `road09` with the same sdpa_compare.py
arguments; SWEEP09_STAGES, STEPS09, ROAD09_REPEAT and ROUNDS became parameters. road09 reads its
road's steps from stage09_backward_kernel --help, as the script did, so a new step is timed
without editing this file.
"""
import os
import re

from .experiment import Experiment, Where
from .runner import SessionError
from .tools import COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, compare, compare_summary, merge_with

STAGE09 = "stages/09_backward_kernel/stage09_backward_kernel"


def _sweep09_commands(p, ctx):
    return [compare(ctx, "sweep09", p["rounds"], "--stages", *p["stages"], "--dtypes", "bf16", "fp16",
                    "--steps09", *(str(s) for s in p["steps09"]), *merge_with())]


SWEEP09 = Experiment(
    name="sweep09",
    stage="09",
    description="stage 07's forward and stage 09's backward (atomic and deterministic dQ), bf16 and fp16, "
                "beside SDPA flash and cuDNN forward, backward and both, the full grid",
    targets=COMPARE_TARGETS,
    params={"stages": ("07", "09"), "steps09": (1,), "rounds": 3},
    param_help={
        # Stage 07's forward runs again: the SDPA forward rows are measured again and 07 is compared with them.
        "stages": "stages compared (--stages); 07 with 09, as SDPA's forward rows are measured again",
        "steps09": "other main kernels of stage 09's road timed beside the default one (--steps09)",
        "rounds": ROUNDS_HELP,
    },
    commands=_sweep09_commands,
    # gpu_sweep.csv keeps the other rows of docs/results/gpu_sweep.csv (--merge-with).
    outputs=COMPARE_OUTPUTS + ("stage07_sweep_table.txt", "stage09_sweep_table.txt", "ratios_over_rounds.txt"),
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
    default step, the record docs/results/ keeps."""
    table = os.path.join(where.results, "stage09_sweep_table.txt")
    if not os.path.isfile(table):
        return
    default, _ = _road09_steps(ctx)
    with open(table) as f:
        body = f.read()
    with open(os.path.join(where.results, "stage09_road09.txt"), "w") as f:
        f.write(f"bench/session.py road09 ({p['rounds']} rounds, each ours then SDPA); B*N = 16384, H*d = 2048.\n")
        f.write(f"In this run the default main kernel (rows stage09) was step {default}; the step tables give every "
                "other step beside it (/09), each timed by its backward with atomic dQ alone.\n")
        f.write(body)


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
    outputs=COMPARE_OUTPUTS + ("stage09_sweep_table.txt", "ratios_over_rounds.txt", "stage09_road09.txt"),
    summary=_road09_summary,
    finish=_road09_finish,
)

EXPERIMENTS = (SWEEP09, ROAD09)
