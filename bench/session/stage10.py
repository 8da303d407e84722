"""Stage 10's experiments (real models' switches: grouped heads, windows, the soft cap, dropout,
packed batches), forward and backward, beside PyTorch SDPA.

Ported from the bash driver's step `stage10` with the same sdpa_compare.py arguments;
STAGE10_DTYPES, STAGE10_MODELS, STAGE10_VARLEN, STAGE10_REPEAT and ROUNDS became parameters.
"""
import dataclasses

from .experiment import Experiment, Where, grep
from .tools import COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, compare, compare_summary, packed_lengths


def _stage10_commands(p, ctx):
    lengths = packed_lengths()
    varlen = ("--varlen07", lengths) if p["varlen"] else ()
    cmd = compare(ctx, "stage10", p["rounds"], "--stages", "10", "--dtypes", *p["dtypes"], "--sizes", "4096", "16384",
                  "--head-dims", "64", "128", "--causal", "yes", "--model07", *p["models"], *varlen,
                  "--repeat", str(p["repeat"]), "--warmup", "3", "--check", "false")
    return [dataclasses.replace(cmd, header=(f"packed lengths: {lengths}",))]


def _stage10_summary(where: Where):
    """The packed lengths, then the points that failed their check and sdpa_compare.py's tables."""
    return grep(where.log, r"^packed lengths: ", 1) + compare_summary(where)


def _check_stage10(p):
    if any(d not in ("bf16", "fp16") for d in p["dtypes"]):
        raise ValueError(f"dtypes must be bf16 or fp16, not {','.join(p['dtypes'])}")


STAGE10 = Experiment(
    name="stage10",
    stage="10",
    description="stage 10's switches forward and backward beside PyTorch SDPA: stage 07's forward and stage 09's "
                "backward with grouped heads 8:1 and 4:1, a 4096-key causal window, dropout 0.1, bf16 and fp16, "
                "d 64/128, N 4096/16384; a packed batch of mixed lengths beside SDPA's nested and padded batches",
    targets=COMPARE_TARGETS,
    params={"dtypes": ("bf16", "fp16"), "models": ("8/-1/0", "4/-1/0", "1/4095/0", "1/-1/0/0/0.1"), "varlen": True,
            "repeat": 10, "rounds": 3},
    param_help={
        "dtypes": "bf16, fp16 or both (--dtypes; STAGE10_DTYPES)",
        "models": "stage 10's switches, G/window/... (--model07; STAGE10_MODELS)",
        "varlen": "the packed batch of mixed lengths (--varlen07; STAGE10_VARLEN=0: none)",
        "repeat": "timed runs per point (--repeat; STAGE10_REPEAT)",
        "rounds": ROUNDS_HELP,
    },
    commands=_stage10_commands,
    outputs=COMPARE_OUTPUTS + ("stage10.txt", "stage10.csv", "ratios_over_rounds.txt"),
    summary=_stage10_summary,
    check=_check_stage10,
)

EXPERIMENTS = (STAGE10,)
