"""Stage 12's experiments (the Hopper backward: K and V stationary per block, the query tiles streamed
by the TMA onto mbarriers, the five products on wgmma, dQ added by the TMA's bulk reduction; sm_90a):
its tests, and a sweep of its road through the stage's own executable.

`sweep12` runs stage12_hopper_backward --bench once per point and step, each appending its record
(the backward's median time, TFLOP/s, the checks against stage 09 and the verdict) to a JSON-lines
file of its own; step 0 is stage 09's default backward, run through stage 12's entry point on the
same GPU. It does not time SDPA yet: bench_gpu and sdpa_compare.py do not know stage 12 (the issue's
side-by-side comparison is a later step of the stage).
"""
import os

from .experiment import Command, Experiment, Where, entries_match, grep

STAGE12 = "stages/12_hopper_backward/stage12_hopper_backward"


def _test12_commands(p, ctx):
    # A kernel that hangs (a barrier's phases out of step) fails its test after the timeout.
    return [Command(("ctest", "--test-dir", ctx.build, "--output-on-failure", "-R", "stage12", "-j4",
                     "--timeout", str(p["timeout"])))]


def _test12_summary(where: Where):
    """Each test's verdict, the count that passed, those that failed or were skipped (last 25)."""
    return grep(where.log, r"Test +#|tests passed|tests failed|Skipped|Failed")[-25:]


TEST12 = Experiment(
    name="test12",
    stage="12",
    description="the tests of stage 12 (ctest -R stage12): every step against stage 09 and the float64 gradients on "
                "the GPU, the emulated kernels, the command line",
    targets=("make_npy_inputs", "stage12_hopper_backward", "test_stage12"),
    params={"timeout": 600},
    param_help={"timeout": "seconds before ctest fails one test (a hung barrier)"},
    commands=_test12_commands,
    outputs=(),  # CTest writes nothing but its log (WORK/logs/test12.log)
    summary=_test12_summary,
)


def _record_name(step, dtype: str, d, n, causal: bool) -> str:
    return f"stage12_step{step}_{dtype}_d{d}_n{n}{'_causal' if causal else ''}.jsonl"


def _sweep12_commands(p, ctx):
    out = ctx.results("sweep12")
    commands = []
    for dtype in p["dtypes"]:
        for d in p["head_dims"]:
            for n in p["sizes"]:
                for causal in (False, True):
                    for step in p["steps"]:
                        argv = (ctx.exe(STAGE12), "--bench", "--reference", "never", "--dtype", dtype,
                                "--head-dim", str(d), "--seq-q", str(n), "--seq-k", str(n),
                                "--batch", str(max(1, p["tokens"] // n)), "--heads", str(max(1, p["width"] // d)),
                                "--step", str(step), "--repeat", str(p["repeat"]), "--warmup", "3",
                                "--json", os.path.join(out, _record_name(step, dtype, d, n, causal)))
                        commands.append(Command(argv + (("--causal",) if causal else ()), ok=(0, 1)))
    return commands


def _sweep12_check(p):
    entries_match("dtypes", r"bf16|fp16", "bf16 or fp16")(p)
    entries_match("steps", r"[0-9]+", "step numbers (0: stage 09's default backward)")(p)
    if any(d not in (64, 128) for d in p["head_dims"]):
        raise ValueError(f"head_dims are 64 or 128, not {','.join(str(d) for d in p['head_dims'])}")


def _sweep12_summary(where: Where):
    """Every point's problem, the backward's time and TFLOP/s, and its verdict (last 80 lines)."""
    return grep(where.log, r"^problem|TFLOP/s|verdict|MISMATCH")[-80:]


SWEEP12 = Experiment(
    name="sweep12",
    stage="12",
    description="stage 12's backward, each step of its road (0: stage 09's default backward), bf16/fp16, d 64/128, "
                "causal and not, B*N and H*d fixed as in the course's grid; one JSON record per point and step",
    targets=("stage12_hopper_backward",),
    params={"steps": ("0", "1"), "dtypes": ("bf16",), "head_dims": (64, 128), "sizes": (1024, 4096, 16384),
            "tokens": 16384, "width": 2048, "repeat": 20},
    param_help={
        "steps": "steps of the road (--step), 0 being stage 09's default backward",
        "dtypes": "bf16, fp16 or both (--dtype)",
        "head_dims": "head dimensions, 64 and/or 128 (--head-dim)",
        "sizes": "sequence lengths N (--seq-q, --seq-k)",
        "tokens": "B*N: the batch is tokens / N",
        "width": "H*d: the heads are width / d",
        "repeat": "timed runs per point (--repeat; the median of at least 20 is the course's rule)",
    },
    commands=_sweep12_commands,
    outputs=("stage12_step{step}_{dtype}_d{d}_n{n}{_causal}.jsonl",),
    summary=_sweep12_summary,
    check=_sweep12_check,
)

EXPERIMENTS = (TEST12, SWEEP12)
