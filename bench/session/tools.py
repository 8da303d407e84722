"""What several stages' experiments share: the side-by-side run through bench/sdpa_compare.py, its
summary, and the arguments that reuse this session's ceilings.

One helper, because every comparison with PyTorch SDPA runs the same way (ours, then SDPA, ROUNDS
times, each ratio's median over the rounds), made into a Command in one place.
"""
from __future__ import annotations

import os
import random

from .experiment import Command, Where, grep, file_lines

# What every comparison builds: bench_gpu, and both ceilings (without them the sweeps print no
# fraction of the ceilings; sdpa_compare.py runs them from beside bench_gpu).
COMPARE_TARGETS = ("bench_gpu", "mma_ceiling", "wgmma_ceiling")

# What sdpa_compare.py writes into its --out-dir whatever it compares (see its docstring).
COMPARE_OUTPUTS = ("gpu_sweep.csv", "gpu_sweep.json", "bench_gpu.json", "bench_gpu.csv", "tables.json")

# The summary's "rounds" parameter: the whole sequence (ours, then SDPA) this many times.
ROUNDS_HELP = "rounds of ours then SDPA; each ratio is the median over them (--rounds)"


# The head of the SDPA scripts that stage 12's and 13's sweeps run as `python3 -c`: torch, the
# backends by the course's names, a 256 MiB buffer to flush the L2 with, and time_call(call, repeat):
# three untimed calls, then `repeat` calls each after a flush, timed by CUDA events; the median in ms.
SDPA_HEAD = r"""
import json, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def time_call(call, repeat):
    for _ in range(3):
        call()
    times = []
    for _ in range(repeat):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); call(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]
"""


def ctest_gpu(ctx, pattern: str, timeout: int) -> list:
    """One ctest over the tests matching `pattern`, the emulated ones left out: they run the kernels on
    the CPU (CI's business), and a reader's build folder may hold them registered but unbuilt. A
    kernel that hangs (a barrier's phases out of step) fails its test after `timeout` seconds."""
    return [Command(("ctest", "--test-dir", ctx.build, "--output-on-failure", "-R", pattern, "-E", "_emulated", "-j4",
                     "--timeout", str(timeout)))]


def ctest_summary(where: Where) -> list:
    """Each test's verdict, the count that passed, those that failed or were skipped (last 25)."""
    return grep(where.log, r"Test +#|tests passed|tests failed|Skipped|Failed")[-25:]


def ceiling_args(ctx) -> list:
    """sdpa_compare.py's options to reuse the ceilings the `ceiling` experiment measured in this
    session, rather than measure them again (none when it did not run)."""
    out = []
    for flag, name in (("--mma-ceiling-json", "mma_ceiling.jsonl"), ("--wgmma-ceiling-json", "wgmma_ceiling.jsonl")):
        path = os.path.join(ctx.results("ceiling"), name)
        if ctx.has_output(path):
            out += [flag, path]
    return out


def compare(ctx, name: str, rounds: int, *options: str) -> Command:
    """bench/sdpa_compare.py with bench_gpu from the build folder, its records in the experiment's
    results folder, this session's ceilings, ROUNDS rounds, then the experiment's options."""
    argv = ("python3", "bench/sdpa_compare.py", "--bench-exe", ctx.exe("bench/bench_gpu"),
            "--out-dir", ctx.results(name), *ceiling_args(ctx), "--rounds", str(rounds), *options)
    return Command(argv, env={"PYTHONUNBUFFERED": "1"})


def merge_with() -> list:
    """The committed sweep whose other rows a new gpu_sweep.csv keeps (--merge-with), when there."""
    path = "docs/results/gpu_sweep.csv"
    return ["--merge-with", path] if os.path.isfile(path) else []


def compare_summary(where: Where) -> list:
    """The points that failed their check and the kernels skipped, then sdpa_compare.py's tables."""
    lines = grep(where.log, r"BAD|MISMATCH|^ +skipped", 20)
    log = file_lines(where.log)
    # The tables start after the first empty line: bench_gpu and the SDPA progress print none.
    start = next((i for i, line in enumerate(log) if not line), len(log))
    return lines + log[start:]


def yes_no(flag: bool) -> str:
    """bench_gpu's and sdpa_compare.py's spelling of a boolean option (--causal yes)."""
    return "yes" if flag else "no"


def packed_lengths() -> str:
    """The packed batch of stage 10's benchmarks: lengths drawn from 128 to 8192 (seed 7) until
    16384 tokens, the last one cut to fit; comma-separated (the batch of stage 10's committed
    records, e.g. docs/results/stage10_packed_windowless.txt)."""
    r, out, left = random.Random(7), [], 16384
    while left > 0:
        n = min(left, r.randint(128, 8192))
        out.append(n)
        left -= n
    return ",".join(map(str, out))


def block_orders(ctx, name: str, variable: str, orders, rounds: int, args, header=()) -> list:
    """ROUNDS rounds of bench_gpu with each value of the environment variable that picks a block
    order, interleaved, into the results folder's NAME.txt, each run under a line naming it."""
    out = os.path.join(ctx.results(name), f"{name}.txt")
    cmds = []
    for r in range(1, rounds + 1):
        for order in orders:
            head = (tuple(header) if not cmds else ()) + (f"== round {r}, block order {order}",)
            cmds.append(Command((ctx.exe("bench/bench_gpu"), *args), env={variable: order}, stdout=out, append=True,
                                header=head))
    return cmds


# The "steps09" parameter of the comparisons that run stage 09: step numbers, or none at all.
STEPS09_HELP = ("other main kernels of stage 09's road timed beside the default one (--steps09): numbers, "
                "or none")


def steps09_args(steps) -> list:
    """sdpa_compare.py's --steps09 for a "steps09" parameter (none: no other step, no option)."""
    chosen = [s for s in steps if s != "none"]
    return ["--steps09", *chosen] if chosen else []

