"""The fresh-copy checks: what a reader does on the GPU machine, as the README says it. A copy of the
working tree without its build folders, the Debian packages of .deps/ (no package access there),
then the README's two commands unchanged, each timed: scripts/course.sh (`newcomer`) and
scripts/test.sh (`newcomer_test`). newcomer.txt records the machine, the compilers, the date and
every verdict, newcomer_test.txt the test run's; docs/make_results.py quotes both as written. Run
`newcomer` in every session that changes build files or GPU code.

scripts/test.sh takes longer than one device call on some machines (about 700 s on an H100), so it
also runs in two parts: `newcomer_test_start` starts it detached, in a session of its own (its log
in /tmp/fa-newcomer-test, which no call's WORK holds), and returns; `newcomer_wait`, in the same
call or a later one on the same machine, waits up to its `wait` seconds and records it, or says it
is still running (then run it again).

None of them builds anything: the copy builds itself, as a reader's would. The shell half (the copy,
the timed runs, the detached start, the wait) is bench/newcomer.sh; the records are written here.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter

from .experiment import Command, Experiment, Where, file_lines, in_results
from .runner import DEPS, deps_commands

SCRIPT = "bench/newcomer.sh"
COPY = "/tmp/fa-newcomer"
TEST_COPY = "/tmp/fa-newcomer-test"

# Where the packages are, and nothing else: the README's commands run as a reader types them.
READER_ENV = {"FA_SKIP_INSTALL": "1", "CMAKE_PREFIX_PATH": f"{DEPS}/usr"}

# The lines of scripts/course.sh's output that say what happened: each stage's banner and verdict,
# the course's and the lessons' last word, failures and compiler errors.
COURSE_VERDICTS = r"^== |^verdict|^course:|^lessons:|FAILED|error:"
# ... and of scripts/test.sh's: each build's banner, CTest's counts, the tests that did not pass.
TEST_VERDICTS = r"^== |tests passed|tests failed|\(Not Run\)|\*\*\*Failed|\*\*\*Skipped|^test: |error:"

HELP = {
    "dir": "the fresh copy of the working tree (emptied first by newcomer)",
    "test_dir": "scripts/test.sh's log and exit status, outside WORK so that a later call finds them",
    "course_limit": "seconds before scripts/course.sh is cut (timeout)",
    "test_limit": "seconds before scripts/test.sh is cut (timeout)",
    "wait": "seconds to wait for scripts/test.sh to end before saying it still runs",
}


def _check_dirs(p: dict) -> None:
    """The folders are emptied: never the root, the working tree or a folder that holds it."""
    here = os.path.realpath(os.getcwd())
    for key in ("dir", "test_dir"):
        if key not in p:
            continue
        path = p[key]
        real = os.path.realpath(path)
        if not os.path.isabs(path) or real == "/" or here == real or here.startswith(real + os.sep):
            raise ValueError(f"{key} is emptied first: an absolute folder outside the working tree, not {path}")


def check_record(name, description, params, commands, outputs, summary, finish=None) -> Experiment:
    """One of the fresh-copy checks: no build targets (the copy builds itself), each parameter's
    help from HELP, the folders checked before anything runs."""
    return Experiment(name=name, stage="all", description=description, targets=(), params=params,
                      param_help={k: HELP[k] for k in params}, commands=commands, outputs=outputs,
                      summary=summary, check=_check_dirs, finish=finish)


# Grep-like readers of a log --------------------------------------------------------------------

def count_matches(lines, pattern: str) -> int:
    """How many lines match (grep -c)."""
    return sum(1 for line in lines if re.search(pattern, line))


def matches_with_after(lines, pattern: str, count: int, after: int) -> list:
    """The first `count` matching lines, each with `after` lines after it, groups apart separated by
    "--" (grep -m COUNT -A AFTER)."""
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)][:count]
    out, end = [], None
    for i in hits:
        if end is not None and i > end:
            out.append("--")
        start = i if end is None else max(i, end)
        out += lines[start:i + after + 1]
        end = max(end or 0, i + after + 1)
    return out


def matches(lines, pattern: str, limit: int) -> list:
    """The first `limit` matching lines (grep -E PATTERN | head -LIMIT)."""
    return [line for line in lines if re.search(pattern, line)][:limit]


# What the records say about the machine --------------------------------------------------------

def first_output_line(argv, last=False) -> str:
    """The first (or last) line a program prints, empty when it is not there or prints nothing."""
    if not shutil.which(argv[0]):
        return ""
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return (lines[-1] if last else lines[0]) if lines else ""


def gpus() -> str:
    """Each GPU's name and driver, as nvidia-smi names them ("; " between GPUs)."""
    if not shutil.which("nvidia-smi"):
        return ""
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True)
    return "; ".join(line.strip() for line in done.stdout.splitlines() if line.strip())


def os_name() -> str:
    for line in file_lines("/etc/os-release"):
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "unknown"


def packages() -> str:
    """The Debian packages of .deps/, name and version from each file's name (name_version_arch.deb)."""
    names = []
    for path in sorted(glob.glob(".deps/*.deb")):
        parts = os.path.basename(path)[:-len(".deb")].split("_")
        names.append(" ".join(parts[:2]))
    return ", ".join(names)


def cuda_targets(build_ninja: str) -> str:
    """The CUDA targets the copy's default build chose on this machine (the GPUs nvidia-smi finds),
    each with the number of its compile lines: "8 arch=compute_90,code=[compute_90,sm_90]; ..."."""
    found = Counter()
    for line in file_lines(build_ninja):
        found.update(re.findall(r"arch=compute_[0-9a]*,code=\[[^]]*\]", line))
    return "; ".join(f"{n} {target}" for target, n in sorted(found.items()))


def read_status(path: str) -> dict | None:
    """bench/newcomer.sh run's record: exit, seconds, start, end (None: it has not ended)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ended(status: dict | None, what: str) -> str:
    if status is None:
        return f"{what}: no exit status (cut short before it ended)"
    return f"{what}: exit {status['exit']}, {status['seconds']} s"


# newcomer: the copy and scripts/course.sh ------------------------------------------------------

def _newcomer_commands(p, ctx):
    out = ctx.results("newcomer")
    return [Command(("bash", SCRIPT, "copy", p["dir"])),
            *deps_commands(),
            Command(("bash", SCRIPT, "run", p["dir"], str(p["course_limit"]), f"{out}/course_status.json",
                     "scripts/course.sh"), env=dict(READER_ENV), stdout=f"{out}/course.log")]


def newcomer_lines(p: dict, where: Where) -> list:
    """newcomer.txt's lines: the machine, the compilers, the date, how the packages came, then
    scripts/course.sh's exit, time and warnings, the CUDA targets, its first warnings and every verdict."""
    log = file_lines(in_results(where, "course.log"))
    status = read_status(in_results(where, "course_status.json"))
    pkgs = packages()
    lines = [
        "A reader's first run on a GPU machine: a fresh copy of flashcourse, then the README's two commands.",
        f"date:     {status['start'] if status else time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"gpu:      {gpus()}",
        f"os:       {os_name()}",
        f"c++:      {first_output_line(['c++', '--version'])}",
        f"nvcc:     {first_output_line(['nvcc', '--version'], last=True)}",
        f"cmake:    {first_output_line(['cmake', '--version'])}",
        (f"packages: {pkgs} unpacked from Debian's .deb files (no package access here):" if pkgs
         else "packages: the machine's own (no .deb files in .deps/):"),
        "          " + " ".join(f"{k}={v}" for k, v in READER_ENV.items()),
        f"{ended(status, 'scripts/course.sh')}; compiler warnings in its build: {count_matches(log, 'warning:')}",
        f"cuda targets: {cuda_targets(os.path.join(p['dir'], 'build', 'build.ninja'))}",
    ]
    return lines + matches_with_after(log, "warning:", 10, 3) + matches(log, COURSE_VERDICTS, 60)


def _newcomer_finish(p, ctx, where: Where):
    """newcomer.txt from the machine, course_status.json and course.log (newcomer_lines)."""
    with open(in_results(where, "newcomer.txt"), "w") as f:
        f.write("".join(line + "\n" for line in newcomer_lines(p, where)))


NEWCOMER = check_record(
    "newcomer",
    "a reader's first run: a fresh copy of the working tree (no build folders, .deps, .whl, .git), the packages "
    "of .deps/, then scripts/course.sh as the README gives it, timed",
    params={"dir": COPY, "course_limit": 900},
    commands=_newcomer_commands,
    outputs=("newcomer.txt", "course.log", "course_status.json"),
    summary="newcomer.txt",
    finish=_newcomer_finish,
)


# newcomer_test and its two parts: scripts/test.sh in the copy ------------------------------------

def _start_commands(p, ctx, name):
    return [*deps_commands(),
            Command(("bash", SCRIPT, "start", p["dir"], str(p["test_limit"]), p["test_dir"]), env=dict(READER_ENV),
                    stdout=os.path.join(ctx.results(name), "started.txt"))]


def _wait_commands(p, ctx):
    return [Command(("bash", SCRIPT, "wait", p["test_dir"], str(p["wait"])))]


def newcomer_test_lines(log, status: dict) -> list:
    """newcomer_test.txt's lines: scripts/test.sh's exit, time, end and warnings, its first warnings,
    then each build's banner, CTest's counts and the tests that did not pass."""
    return ([f"{ended(status, 'scripts/test.sh')} ({status['end']}); compiler warnings in its builds: "
             f"{count_matches(log, 'warning:')}"]
            + matches_with_after(log, "warning:", 10, 3) + matches(log, TEST_VERDICTS, 80))


def _test_finish(p, ctx, where: Where):
    """test.log and test_status.json copied from test_dir (as far as scripts/test.sh got), and
    newcomer_test.txt from them once it has ended (newcomer_test_lines)."""
    for name, copy in (("test.log", "test.log"), ("status.json", "test_status.json")):
        src = os.path.join(p["test_dir"], name)
        if os.path.isfile(src):
            shutil.copyfile(src, in_results(where, copy))
    status = read_status(in_results(where, "test_status.json"))
    if status is not None:
        lines = newcomer_test_lines(file_lines(in_results(where, "test.log")), status)
        with open(in_results(where, "newcomer_test.txt"), "w") as f:
            f.write("".join(line + "\n" for line in lines))


def _started_summary(where: Where):
    """What the start said (the folder and the log of scripts/test.sh), and which experiment collects it."""
    return file_lines(in_results(where, "started.txt")) + ["newcomer_wait collects it: python3 bench/session.py run "
                                                          "newcomer_wait (the same call or a later one on this machine)"]


NEWCOMER_TEST_START = check_record(
    "newcomer_test_start",
    "the README's second command (scripts/test.sh) in newcomer's copy, started detached in a session of its own "
    "(setsid), so that it outlives a device call shorter than it; newcomer_wait records it",
    params={"dir": COPY, "test_dir": TEST_COPY, "test_limit": 1200},
    commands=lambda p, ctx: _start_commands(p, ctx, "newcomer_test_start"),
    outputs=("started.txt",),
    summary=_started_summary,
)

NEWCOMER_WAIT = check_record(
    "newcomer_wait",
    "waits for the scripts/test.sh that newcomer_test_start started, then records it (or says it is still "
    "running: run it again)",
    params={"test_dir": TEST_COPY, "wait": 540},
    commands=_wait_commands,
    outputs=("newcomer_test.txt", "test.log", "test_status.json"),
    summary="newcomer_test.txt",
    finish=_test_finish,
)

NEWCOMER_TEST = check_record(
    "newcomer_test",
    "the README's second command (scripts/test.sh) in newcomer's copy, as a reader runs it after the first: "
    "newcomer_test_start and newcomer_wait in one (up to its own time limit)",
    params={"dir": COPY, "test_dir": TEST_COPY, "test_limit": 1200, "wait": 1260},
    commands=lambda p, ctx: _start_commands(p, ctx, "newcomer_test") + _wait_commands(p, ctx),
    outputs=("started.txt", "newcomer_test.txt", "test.log", "test_status.json"),
    summary="newcomer_test.txt",
    finish=_test_finish,
)

EXPERIMENTS = (NEWCOMER, NEWCOMER_TEST, NEWCOMER_TEST_START, NEWCOMER_WAIT)
