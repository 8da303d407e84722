"""The PyTorch operator's experiment (python/: torch.ops.flashcourse over stages 07, 09, 11 and 12).

`torchop` builds the package as a user would (`python3 -m pip install --no-build-isolation ./python`,
timed, from an empty build folder), runs its GPU tests (python/tests: opcheck, SDPA, the float64
gradients, varlen, torch.compile, torch.export, the refusals), then trains the small GPT of
python/examples/train_gpt.py four times on the same batches: SDPA with seeds 0 and 1 (the run-to-run
spread), the course's operator with seed 0, and the course's packed form (cu_seqlens) with seed 0
against its padded run. `finish` writes torch_gpt.json: each run's median tokens per second and final
loss, and how far the course's curve lies from SDPA's of the same seed beside how far SDPA's two
seeds lie apart; the plot of the four curves is torch_gpt_loss.svg.

The parts can run in separate calls (build, tests, train): the package stays installed on the machine.
"""
from __future__ import annotations

import json
import os

from .experiment import Command, Experiment, Where, file_lines, grep, in_results
from .runner import DEPS, deps_commands

# python3 -c TIMED OUT_JSON ARGV...: runs ARGV (its output to this one's), then writes
# {"seconds": wall time, "exit": its exit code, "argv": ARGV} to OUT_JSON and exits with its code.
TIMED = r"""
import json, subprocess, sys, time
t0 = time.monotonic()
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"seconds": round(time.monotonic() - t0, 1), "exit": rc, "argv": sys.argv[2:]}, f)
sys.exit(rc)
"""

BUILD_COMMAND = ("python3", "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-v", "./python")

# The training runs: record name -> train_gpt.py's options.
RUNS = {
    "sdpa_seed0": ("--attention", "sdpa", "--seed", "0"),
    "sdpa_seed1": ("--attention", "sdpa", "--seed", "1"),
    "flashcourse_seed0": ("--attention", "flashcourse", "--seed", "0"),
    "flashcourse_varlen_seed0": ("--attention", "flashcourse", "--seed", "0", "--varlen"),
}


def _torchop_commands(p, ctx):
    out = ctx.results("torchop")
    commands = []
    if p["build"]:
        commands += deps_commands()
        commands.append(Command(("rm", "-rf", "python/build")))
        commands.append(Command(("python3", "-c", TIMED, os.path.join(out, "build_time.json"), *BUILD_COMMAND),
                                env={"CMAKE_PREFIX_PATH": f"{DEPS}/usr"}, stdout=os.path.join(out, "build.log")))
    if p["tests"]:
        commands.append(Command(("python3", "-m", "pytest", "-q", "-rs", "python/tests",
                                 "--junitxml", os.path.join(out, "pytest.xml")), stdout=os.path.join(out, "pytest.log")))
    if p["train"]:
        for name, options in RUNS.items():
            commands.append(Command(("python3", "python/examples/train_gpt.py", *options, "--steps", str(p["steps"]),
                                     "--rows", str(p["rows"]), "--out", os.path.join(out, f"gpt_{name}.jsonl"))))
        commands.append(Command(("python3", "python/examples/plot_losses.py",
                                 *(os.path.join(out, f"gpt_{name}.jsonl") for name in RUNS),
                                 "--out", os.path.join(out, "torch_gpt_loss.svg"))))
    return commands


def losses(path: str) -> list:
    """The per-step losses of a train_gpt.py record, in step order (none when it is missing)."""
    return [r["loss"] for r in (json.loads(x) for x in file_lines(path)) if r.get("kind") == "step"]


def smoothed(xs: list, width: int) -> list:
    """The running mean over the last `width` values (fewer at the start)."""
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x - (xs[i - width] if i >= width else 0.0)
        out.append(total / min(i + 1, width))
    return out


def curve_gap(a: list, b: list, width: int = 20) -> float | None:
    """The mean absolute difference of two loss curves, each smoothed over `width` steps, on their common steps."""
    n = min(len(a), len(b))
    if n == 0:
        return None
    sa, sb = smoothed(a[:n], width), smoothed(b[:n], width)
    return sum(abs(x - y) for x, y in zip(sa, sb)) / n


def summary_of(path: str) -> dict:
    """The last line of a train_gpt.py record (its median speed and final loss), {} when missing."""
    lines = file_lines(path)
    last = json.loads(lines[-1]) if lines else {}
    return last if last.get("kind") == "summary" else {}


def _torchop_finish(p, ctx, where: Where):
    """torch_gpt.json: each run's tokens per second and final loss; the course's curve's distance from SDPA's
    (same seed) beside SDPA's seed-to-seed distance; the packed run's speed over the padded one's."""
    if not p["train"]:
        return
    runs = {name: summary_of(in_results(where, f"gpt_{name}.jsonl")) for name in RUNS}
    curves = {name: losses(in_results(where, f"gpt_{name}.jsonl")) for name in RUNS}
    speed = {name: r.get("tokens_per_s_median") for name, r in runs.items()}

    def ratio(a, b):
        return speed[a] / speed[b] if speed[a] and speed[b] else None

    record = {
        "runs": {name: {"tokens_per_s_median": speed[name], "final_loss": r.get("final_loss")} for name, r in runs.items()},
        "gap_flashcourse_vs_sdpa_seed0": curve_gap(curves["flashcourse_seed0"], curves["sdpa_seed0"]),
        "gap_sdpa_seed1_vs_seed0": curve_gap(curves["sdpa_seed1"], curves["sdpa_seed0"]),
        "speed_flashcourse_over_sdpa": ratio("flashcourse_seed0", "sdpa_seed0"),
        "speed_varlen_over_padded": ratio("flashcourse_varlen_seed0", "flashcourse_seed0"),
    }
    gap, spread = record["gap_flashcourse_vs_sdpa_seed0"], record["gap_sdpa_seed1_vs_seed0"]
    record["curves_agree"] = gap is not None and spread is not None and gap <= spread
    with open(in_results(where, "torch_gpt.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


def _torchop_summary(where: Where):
    """The build's time, pytest's closing line and skips, and the training runs' record (torch_gpt.json)."""
    lines = []
    build = in_results(where, "build_time.json")
    if os.path.isfile(build):
        with open(build) as f:
            b = json.load(f)
        lines.append(f"build: {b['seconds']:.0f} s, exit {b['exit']} ({' '.join(BUILD_COMMAND)})")
    log = in_results(where, "pytest.log")
    lines += grep(log, r"(passed|failed|error|skipped)( |,|$)")[-6:] + grep(log, r"^(FAILED|ERROR|SKIPPED)")[:20]
    gpt = in_results(where, "torch_gpt.json")
    if os.path.isfile(gpt):
        with open(gpt) as f:
            r = json.load(f)
        for name, run in r["runs"].items():
            lines.append(f"{name}: {run['tokens_per_s_median'] or 0:.0f} tokens/s, final loss {run['final_loss']}")
        lines.append(f"loss curves: flashcourse vs SDPA (seed 0) {r['gap_flashcourse_vs_sdpa_seed0']}, SDPA seed 1 vs 0 "
                     f"{r['gap_sdpa_seed1_vs_seed0']}: {'agree' if r['curves_agree'] else 'DO NOT agree'}")
        lines.append(f"speed: flashcourse / SDPA {r['speed_flashcourse_over_sdpa']}, packed / padded "
                     f"{r['speed_varlen_over_padded']}")
    return lines


def _torchop_check(p):
    if not (p["build"] or p["tests"] or p["train"]):
        raise ValueError("build, tests and train are all false: nothing would run")
    if p["steps"] < 1 or p["rows"] < 1:
        raise ValueError(f"steps and rows are at least 1, not {p['steps']} and {p['rows']}")


TORCHOP = Experiment(
    name="torchop",
    stage="all",
    description="the PyTorch operator (python/): its build by pip, timed; its GPU tests (opcheck, SDPA, float64 "
                "gradients, varlen, torch.compile, torch.export, refusals); a small GPT trained with SDPA (seeds 0 and "
                "1), with the operator (seed 0) and with its packed form (cu_seqlens), the loss curves and speeds",
    targets=(),  # the package is built by pip, from the source tree, into python/build
    params={"build": True, "tests": True, "train": True, "steps": 300, "rows": 32},
    param_help={
        "build": "build and install the package (pip, from an empty python/build), timed",
        "tests": "run python/tests with pytest (the package installed)",
        "train": "the four training runs of python/examples/train_gpt.py and their plot",
        "steps": "training steps of each run (--steps)",
        "rows": "documents per batch (--rows)",
    },
    commands=_torchop_commands,
    outputs=("build_time.json", "build.log", "pytest.log", "pytest.xml", "gpt_{run}.jsonl", "torch_gpt_loss.svg",
             "torch_gpt.json"),
    summary=_torchop_summary,
    check=_torchop_check,
    finish=_torchop_finish,
)

EXPERIMENTS = (TORCHOP,)
