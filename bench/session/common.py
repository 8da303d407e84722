"""Experiments that belong to no one stage: the whole CTest suite and the machine's ceilings.

Ported from bench/gpu_session.sh's steps `test` and `ceiling`, with the same commands. The ceilings
run before the comparisons of the same call reuse them (tools.ceiling_args): put `ceiling` first.
"""
from .experiment import ALL_TARGETS, Command, Experiment, Where, file_lines, in_results, tail


def _test_commands(p, ctx):
    return [Command(("ctest", "--test-dir", ctx.build, "--output-on-failure", "-j8", "--timeout", str(p["timeout"])))]


def _test_summary(where: Where):
    """The last 25 lines of ctest's log: the failed tests and the count of those that passed."""
    return tail(where.log, 25)


TEST = Experiment(
    name="test",
    stage="all",
    description="the whole CTest suite on the GPU (builds every target)",
    targets=ALL_TARGETS,
    params={"timeout": 300},
    param_help={"timeout": "seconds before ctest fails one test (--timeout)"},
    commands=_test_commands,
    outputs=(),  # CTest writes nothing but its log (WORK/logs/test.log)
    summary=_test_summary,
)


def _ceiling_commands(p, ctx):
    out = ctx.results("ceiling")
    return [
        Command((ctx.exe("bench/mma_ceiling"), "--json", f"{out}/mma_ceiling.jsonl"), stdout=f"{out}/mma_ceiling.txt"),
        # Stage 11's ceiling; 77 on a GPU without wgmma is recorded, not a failure.
        Command((ctx.exe("bench/wgmma_ceiling"), "--json", f"{out}/wgmma_ceiling.jsonl"),
                stdout=f"{out}/wgmma_ceiling.txt", ok=(0, 77)),
    ]


def _ceiling_summary(where: Where):
    """What both ceilings printed: mma.sync bf16/fp16, ex2.approx, FMA; dense wgmma bf16/fp16."""
    return file_lines(in_results(where, "mma_ceiling.txt")) + file_lines(in_results(where, "wgmma_ceiling.txt"))


CEILING = Experiment(
    name="ceiling",
    stage="all",
    description="peak rates: mma.sync m16n8k16 bf16/fp16, ex2.approx, fp32 FMA; wgmma m64n256k16 bf16/fp16",
    targets=("mma_ceiling", "wgmma_ceiling"),
    params={},
    param_help={},
    commands=_ceiling_commands,
    outputs=("mma_ceiling.jsonl", "mma_ceiling.txt", "wgmma_ceiling.jsonl", "wgmma_ceiling.txt"),
    summary=_ceiling_summary,
)

EXPERIMENTS = (TEST, CEILING)
