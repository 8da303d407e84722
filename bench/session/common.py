"""Experiments that belong to no one stage: the whole CTest suite and the machine's ceilings.

Ported from the bash driver's steps `test` and `ceiling`, with the same commands. The ceilings
run before the comparisons of the same call reuse them (tools.ceiling_args): put `ceiling` first.
Also ported: `sanitize` (several stages in one results folder, SANITIZE_STAGES), `quick`, `sweep`,
`timing`, `lessons` and `prebuilt`, whose environment variables (QUICK_STAGES, QUICK_SIZES, STEPS09,
ROUNDS, PREBUILT) became parameters. prebuilt checks stage 11's SASS for a serialized wgmma
pipeline as a build does (runner.sass_check), but lists no registers or spills per kernel (the bash
driver's list_resources is not ported).
"""
import os

from . import runner, sanitize
from .experiment import ALL_TARGETS, Command, Experiment, Where, entries_match, file_lines, in_results, tail
from .tools import COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, STEPS09_HELP, compare, compare_summary, steps09_args


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



def _sanitize_commands(p, ctx):
    cmds = []
    for stage in p["stages"]:
        cmds += sanitize.commands(stage, p, ctx, ctx.results("sanitize"))
    return cmds


def _check_sanitize(p):
    bad = [s for s in p["stages"] if s not in sanitize.EXES]
    if bad:
        raise ValueError(f"stages are {', '.join(sanitize.EXES)}, not {','.join(bad)}")
    sanitize.check_tools(p)


SANITIZE = Experiment(
    name="sanitize",
    stage="all",
    description="compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on several stages' executables in one "
                "results folder (one stage: sanitize05 ... sanitize11, sanitize07m, sanitize09m)",
    targets=tuple(sorted(t for _, t in sanitize.EXES.values())),
    params={"stages": ("05", "06", "07", "09"), "tools": sanitize.TOOLS, "steps09": ("all",), "steps11": ("all",), "steps12": ("all",),
            "cases09m": sanitize.CASES09M},
    param_help={
        "stages": "stages (SANITIZE_STAGES): 05 06 07 09 11 12 13, 07m and 09m (stage 10's switches through the tests)",
        "tools": sanitize.TOOLS_HELP,
        "steps09": "stage 09's main kernels (SANITIZE09_STEPS): all (every step its --help names), or numbers",
        "steps11": "stage 11's steps (SANITIZE11_STEPS): all (1 to the last its --help names), or numbers",
        "steps12": "stage 12's steps: all (1 to the last its --help names), or numbers",
        "cases09m": sanitize.CASES09M_HELP,
    },
    commands=_sanitize_commands,
    outputs=(sanitize.OUTPUT.format(stage="{stage}", tool="{tool}"),),
    summary=sanitize.summary,
    check=_check_sanitize,
)


def _quick_commands(p, ctx):
    return [compare(ctx, "quick", p["rounds"], "--stages", *p["stages"], "--dtypes", *p["dtypes"],
                    "--sizes", *(str(n) for n in p["sizes"]), "--repeat", "10", "--warmup", "2", *steps09_args(p["steps09"]))]


def _quick_check(p):
    entries_match("steps09", r"[0-9]+|none", "step numbers or none")(p)
    entries_match("dtypes", r"bf16|fp16", "bf16 or fp16")(p)


QUICK = Experiment(
    name="quick",
    stage="all",
    description="every chosen stage beside every SDPA backend at two sizes, 10 runs each (09: beside SDPA's backward; "
                "11: beside SDPA cuDNN and flash)",
    targets=COMPARE_TARGETS,
    params={"stages": ("05", "06", "07"), "dtypes": ("bf16", "fp16"), "sizes": (2048, 8192), "steps09": ("1",), "rounds": 3},
    param_help={"stages": "stages compared (--stages; QUICK_STAGES)",
                "dtypes": "16-bit types of stages 07, 09 and 11 and of SDPA beside them (--dtypes)",
                "sizes": "sequence lengths N (--sizes; QUICK_SIZES)",
                "steps09": STEPS09_HELP + " (STEPS09)", "rounds": ROUNDS_HELP},
    check=_quick_check,
    commands=_quick_commands,
    outputs=COMPARE_OUTPUTS + ("stage{NN}_sweep_table.txt", "ratios_over_rounds.txt"),
    summary=compare_summary,
)


def _sweep_commands(p, ctx):
    return [compare(ctx, "sweep", p["rounds"], "--stages", *p["stages"])]


SWEEP = Experiment(
    name="sweep",
    stage="all",
    description="stages 05, 06, 07 beside every PyTorch SDPA backend, the full grid (as the committed data)",
    targets=COMPARE_TARGETS,
    params={"stages": ("05", "06", "07"), "rounds": 3},
    param_help={"stages": "stages compared (--stages)", "rounds": ROUNDS_HELP},
    commands=_sweep_commands,
    outputs=COMPARE_OUTPUTS + ("stage07_sweep_table.txt", "ratios_over_rounds.txt"),
    summary=compare_summary,
)


def _timing_commands(p, ctx):
    out = ctx.results("timing")
    return [Command(("python3", "bench/timing_check.py", "--rounds", str(p["rounds"]), "--out", f"{out}/timing_check.txt"))]


TIMING = Experiment(
    name="timing",
    stage="all",
    description="SDPA flash's bf16 forward timed four ways in one process (bench/timing_check.py: the course's events, "
                "Triton's do_bench, each run on an idle GPU, a CUDA graph), d 64/128, N 1024/4096/16384, causal and not",
    targets=(),  # PyTorch alone
    params={"rounds": 3},
    param_help={"rounds": "rounds of every way (--rounds; ROUNDS)"},
    commands=_timing_commands,
    outputs=("timing_check.txt",),
    summary="timing_check.txt",
)

# The lessons' runs: (executable in the build folder, its arguments, the file its output goes to).
LESSON_RUNS = (
    ("stages/05_shared_memory_kernel/stage05_shared_memory_kernel",
     "--heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --bench", "stage05_run.txt"),
    ("stages/06_causal_masking/stage06_causal_masking",
     "--heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --causal --bench", "stage06_run.txt"),
    ("stages/07_pipelined_fused_kernel/stage07_pipelined_fused_kernel",
     "--heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --causal --bench", "stage07_run.txt"),
    ("stages/09_backward_kernel/stage09_backward_kernel",
     "--heads 4 --seq-q 1000 --seq-k 1000 --head-dim 64 --causal --bench", "stage09_run.txt"),
    ("stages/09_backward_kernel/stage09_backward_kernel",
     "--bench --batch 4 --heads 32 --seq-q 4096 --seq-k 4096 --reference never", "stage09_bench_run.txt"),
    ("stages/10_real_models/stage10_real_models",
     "--seqlens 700,37,1200,1,300 --heads 8 --kv-heads 2 --head-dim 64 --causal --bench", "stage10_run.txt"),
)


def _lessons_commands(p, ctx):
    out = ctx.results("lessons")
    return [Command((ctx.exe(exe), *args.split()), stdout=f"{out}/{name}") for exe, args, name in LESSON_RUNS]


def _lessons_summary(where: Where):
    """The last four lines of each lesson run, under its file's name (as tail -n 4 prints them)."""
    lines = []
    for _, _, name in LESSON_RUNS:
        lines += ([""] if lines else []) + [f"==> {name} <=="] + tail(in_results(where, name), 4)
    return lines


LESSONS = Experiment(
    name="lessons",
    stage="all",
    description="the runs the lessons of stages 05, 06, 07, 09 and 10 show",
    targets=tuple(os.path.basename(exe) for exe, _, _ in LESSON_RUNS[:4]) + ("stage10_real_models",),
    params={},
    param_help={},
    commands=_lessons_commands,
    outputs=tuple(name for _, _, name in LESSON_RUNS),
    summary=_lessons_summary,
)



def _prebuilt_commands(p, ctx):
    out = ctx.results("prebuilt")
    return [Command(("test", "-f", p["archive"])),  # fails alone when the archive is not there
            Command(("mkdir", "-p", ctx.build)),
            Command(("tar", "-xaf", p["archive"], "-C", ctx.build)),
            Command(("tar", "-taf", p["archive"]), stdout=f"{out}/archive_files.txt")]


def _prebuilt_finish(p, ctx, where: Where):
    """prebuilt.txt: each file of the archive now in the build folder, with its size; then, when
    stage 11's executable is among them, its SASS checked as a build's is (wgmma_sass.txt)."""
    lines, serialized = [], []
    names = [os.path.normpath(name) for name in file_lines(in_results(where, "archive_files.txt"))]
    for name in names:
        path = os.path.join(ctx.build, name)
        if os.path.isfile(path):
            lines.append(f"  {name} ({os.path.getsize(path)} bytes)")
    if runner.STAGE11_EXE in names:
        sass, serialized = runner.sass_check(ctx.exe(runner.STAGE11_EXE), in_results(where, "wgmma_sass.txt"))
        lines += sass
    with open(in_results(where, "prebuilt.txt"), "w") as f:
        f.write("".join(line + "\n" for line in lines))
    if serialized:
        raise runner.SessionError("a stage 11 kernel waits on every HGMMA (a serialized wgmma pipeline): see prebuilt.txt")


PREBUILT = Experiment(
    name="prebuilt",
    stage="all",
    description="instead of a build: executables built on another machine (bench/pack_build.sh) unpacked into the "
                "build folder; run it with --no-build, before the experiments that use them",
    targets=(),
    params={"archive": ".carry/build.txz"},
    param_help={"archive": "the archive, paths relative to the build folder (PREBUILT)"},
    commands=_prebuilt_commands,
    outputs=("archive_files.txt", "prebuilt.txt", "wgmma_sass.txt"),
    summary="prebuilt.txt",
    finish=_prebuilt_finish,
)

EXPERIMENTS = (TEST, CEILING, PREBUILT, SANITIZE, QUICK, SWEEP, TIMING, LESSONS)
