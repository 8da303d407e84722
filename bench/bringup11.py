#!/usr/bin/env python3
"""Stage 11 brought up on a new Hopper GPU from the smallest piece up, each command under a time
limit, so that a barrier that never completes shows as a timeout (exit 137) naming the command and
the rest still runs. The session's experiment `bringup11` runs it after building its targets:

    python3 bench/session.py run bringup11 --set bringup11.steps=1,2,3 --set bringup11.budget=300
    python3 bench/bringup11.py --build build-gpu --out /tmp/bringup11    # alone, on a built folder

The parts, in order (the sections of its output, which the experiment keeps as its log):

  GPU and toolkit  nvidia-smi's name, compute capability, clocks and driver; nvcc's version
  build            each target the session built (TARGETS) looked for in --build
  SASS             `cuobjdump -sass` of stage 11's executable: HGMMA (wgmma), HMMA (mma.sync) and
                   UTMALDG (TMA loads) counted in stage 11's kernels and in the others (stage 07's,
                   step 0); no HGMMA in stage 11 is a failure. `cuobjdump -res-usage`: registers
                   and local (spill) bytes of each stage 11 kernel instance
  1. host maps     test_hopper_layouts (descriptors, swizzle, fragments: no GPU work)
  2. wrappers      test_hopper_wrappers with FA_CUDA_SYNC=1 (a check after every launch)
  3. steps         each of --steps on two small problems with FA_CUDA_SYNC=1: a step whose run is
                   killed at its limit hung, and is left out of parts 4 and 5
  4. timing        each of --timed among the steps that finished (step 0, stage 07's kernel,
                   always) at B 1, H 16, N 4096, bf16, d 64 and 128, causal and not, with --json
  5. tests         test_stage11 one test case at a time, FA_STAGE11_STEPS = the steps that finished
  6. ceiling       wgmma_ceiling --json

--budget bounds the whole run from the script's start (the session's build comes before it): a
command's limit is cut to what is left, and a command that would start with less than 3 s left is
not run and says so (the reads of nvidia-smi, nvcc, cuobjdump and --help are cut too).

Written into --out: each timed run's own record (stage11_bench_*.jsonl, what
`stage11_hopper_kernel --json` appends), the ceilings (wgmma_ceiling.jsonl) and, from both,
stage11_first_contact.json, the record docs/results_pages/readers.py's read_first_contact()
reads; it is written again after each timed run and after the ceiling, so a run cut short keeps
what it had. Step names come from stage11_hopper_kernel --help, the one place the executable
lists its road (its --json record has no step). Ported from the bash script that took stage 11's
first timings on 2026-11-23 (docs/results/stage11_first_contact*.txt, their logs).

Exit 0 when every command that ran succeeded (77, no Hopper GPU, is named apart), 1 when one
failed or hung or stage 11's SASS has no HGMMA, 2 on bad arguments. Python 3 standard library only.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter

# What this script runs, by the target that builds it and its path in the build folder.
TARGETS = {
    "test_hopper_layouts": "tests/test_hopper_layouts",
    "test_hopper_wrappers": "tests/test_hopper_wrappers",
    "test_stage11": "tests/test_stage11",
    "stage11_hopper_kernel": "stages/11_hopper_kernel/stage11_hopper_kernel",
    "wgmma_ceiling": "bench/wgmma_ceiling",
}
RECORD = "stage11_first_contact.json"
CEILINGS = "wgmma_ceiling.jsonl"
FORMAT = "flashcourse-first-contact"  # docs/results_pages/readers.py FIRST_CONTACT_FORMAT, version 1

HUNG = 137  # killed at its limit, as `timeout --signal=KILL` reports it
SKIPPED = 125  # not started: the budget is spent
NO_HOPPER = 77  # the executable found no Hopper GPU (fa::kExitSkipped)
LEAST_LEFT = 3  # seconds of budget below which nothing more starts
SYNC = {"FA_CUDA_SYNC": "1"}  # a synchronizing check after every launch

# Part 3's two small problems: tails in both sequence lengths (Nq < Nk), then fp16, bnhd, causal
# with Nq > Nk (query tiles past the last key), several batches and heads.
SMALL_PROBLEMS = (
    ("--heads", "2", "--seq-q", "200", "--seq-k", "333", "--head-dim", "64"),
    ("--heads", "3", "--batch", "2", "--seq-q", "300", "--seq-k", "130", "--head-dim", "128", "--dtype", "fp16",
     "--layout", "bnhd", "--causal"),
)
TIMED_DTYPE = "bf16"  # the executable's default: part 4 passes no --dtype
TIMED_SHAPE = ("--heads", "16", "--seq-q", "4096", "--seq-k", "4096")
# The test cases every step goes through (test_stage11.cpp's names, as doctest's wildcards); each
# step's own case is "*step S (*".
SHARED_CASES = ("*road: every step*", "*diagonal*", "*writes every output*", "*any finite scale*",
                "*longer sequences*", "*refuses*", "*agrees with stage 07*")
# The lines of a timed run kept in the log: its configuration, time, rate, clock and verdict.
BENCH_LINE = re.compile(r"^(config|bench|rate|clock|verdict|error)|FAIL")


def shell_line(argv, env=None) -> str:
    """The command as one would type it: `env K=V` first when it sets any."""
    words = (["env"] + [f"{k}={v}" for k, v in env.items()] if env else []) + [str(a) for a in argv]
    return shlex.join(words)


def run_process(argv, env, limit, keep, out) -> int:
    """argv with env added, its whole process group killed after limit seconds: its exit code (128
    + N for signal N, HUNG when killed at the limit, 127 when it cannot start). Its output goes to
    out as it comes; with keep (a test of one line), it is read whole and only the lines kept go."""
    out.flush()
    try:
        proc = subprocess.Popen([str(a) for a in argv], env={**os.environ, **env},
                                stdout=subprocess.PIPE if keep else out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group: a kill reaches its children
    except OSError as e:
        out.write(f"{argv[0]}: {e}\n")
        return 127
    try:
        data, _ = proc.communicate(timeout=limit)
        rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended between the timeout and the kill
            pass
        data, _ = proc.communicate()
        rc = HUNG
    if keep:
        out.write("".join(line + "\n" for line in (data or b"").decode(errors="replace").splitlines() if keep(line)))
    return rc


def capture_output(argv, limit=60) -> str | None:
    """What argv prints (stdout and stderr), or None when it cannot start or runs past limit."""
    try:
        done = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=limit)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode(errors="replace")


class BringUp:
    """One run: its output, its budget and what each command gave. execute and capture stand for
    run_process and capture_output, clock for time.monotonic (the tests pass fakes of all three)."""

    def __init__(self, build, budget, out=None, clock=time.monotonic, execute=run_process, capture=capture_output):
        self.build, self.budget, self.out = build, budget, out or sys.stdout
        self.clock, self.execute, self.capture = clock, execute, capture
        self.start = clock()
        self.ran = []  # (command line, exit code) of every command, SKIPPED for those not started
        self.problems = []  # failures that are not a command's exit code (a SASS without HGMMA)

    def exe(self, target: str) -> str:
        return os.path.join(self.build, TARGETS[target])

    def say(self, *lines: str):
        self.out.write("".join(line + "\n" for line in lines))
        self.out.flush()

    def section(self, title: str):
        self.say("", f"=== {title}")

    def seconds(self) -> int:
        return int(self.clock() - self.start)

    def read(self, argv, limit=60) -> str | None:
        """What argv prints (capture), under min(limit, what is left of the budget, at least 1 s)."""
        return self.capture(argv, max(1, min(limit, self.budget - self.seconds())))

    def run(self, limit: int, argv, env=None, keep=None) -> int:
        """argv under min(limit, what is left of the budget), with its line and exit code around its
        output; past the budget, nothing run (SKIPPED)."""
        line, left = shell_line(argv, env), self.budget - self.seconds()
        if left < LEAST_LEFT:
            self.say(f"$ {line}", f"[skipped: the {self.budget}-second budget is spent]")
            self.ran.append((line, SKIPPED))
            return SKIPPED
        self.say(f"$ {line}")
        rc = self.execute([str(a) for a in argv], env or {}, min(limit, left), keep, self.out)
        self.say(f"[exit {rc}, {self.seconds()} s into the run]")
        self.ran.append((line, rc))
        return rc

    def tally(self) -> tuple:
        """(lines naming what failed, hung, found no Hopper GPU or was skipped; 0 or 1 as the exit)."""
        kinds = {HUNG: "hung (killed at its limit)", NO_HOPPER: "no Hopper GPU (exit 77)"}
        lines = [f"{kinds.get(rc, f'failed (exit {rc})')}: {line}" for line, rc in self.ran if rc not in (0, SKIPPED)]
        lines += [f"failed: {p}" for p in self.problems]
        skipped = [line for line, rc in self.ran if rc == SKIPPED]
        if skipped:
            lines.append(f"skipped, the budget spent: {len(skipped)} command(s), from {skipped[0]}")
        ok = not self.problems and all(rc in (0, SKIPPED, NO_HOPPER) for _, rc in self.ran)
        return lines + [f"verdict: {'every command that ran succeeded' if ok else 'FAILED'}"], 0 if ok else 1


# Readers of what the tools print ----------------------------------------------------------------

def road_names(help_text: str | None) -> dict:
    """{step: name} from stage11_hopper_kernel --help: under --step, one line per step of the road,
    "N name: idea", numbered from 0 (fa::road_help)."""
    names, lines = {}, (help_text or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("--step ")), None)
    if start is None:
        return names
    for line in lines[start + 1:]:
        found = re.match(rf"\s*{len(names)} ([^:]+): ", line)
        if not found:
            break
        names[len(names)] = found.group(1)
    return names


def sass_counts(sass: str) -> dict:
    """{group: Counter of HGMMA, HMMA, UTMALDG} over `cuobjdump -sass`'s functions, the groups being
    stage 11's kernels (a name with stage11) and the other kernels (stage 07's, which step 0 runs)."""
    groups, group = {"stage 11": Counter(), "other kernels": Counter()}, None
    for line in sass.splitlines():
        if "Function :" in line:
            group = "stage 11" if "stage11" in line.split("Function :", 1)[1] else "other kernels"
        elif group:
            for op in ("HGMMA", "HMMA", "UTMALDG"):
                groups[group][op] += op in line
    return groups


def sass_lines(groups: dict) -> list:
    return [f"{g}: {n[op]} {op}" for op in ("HGMMA", "HMMA", "UTMALDG") for g, n in groups.items() if n[op]]


# A stage 11 kernel instance as `cuobjdump -res-usage` names it, mangled: hopper_forward_kernel<T, D,
# StepN<S>> (TimelineStepN: the instrumented build; SmallBlocksN: step 11's small blocks).
KERNEL_NAME = re.compile(r"kernelI[0-9]+_*(\w+?)Li([0-9]+)E.*?[0-9]+(StepN|TimelineStepN|SmallBlocksN)ILi([0-9]+)E")
VARIANT = {"StepN": "", "TimelineStepN": " (instrumented)", "SmallBlocksN": " (small blocks)"}


def register_lines(res_usage: str) -> list:
    """One line per stage 11 kernel instance of `cuobjdump -res-usage`: step, d, type, registers at
    launch (setmaxnreg moves them between warpgroups) and local bytes (spills), ordered by step."""
    rows, name = set(), None
    for line in res_usage.splitlines():
        head = re.match(r"\s*Function (\S+):", line)
        if head:
            name = head.group(1)
            continue
        usage = re.search(r"REG:([0-9]+).*LOCAL:([0-9]+)", line)
        if name and "stage11" in name and usage:
            k = KERNEL_NAME.search(name)
            if k:
                rows.add((int(k.group(4)), f"d={k.group(2)}", f"{k.group(1)}{VARIANT[k.group(3)]}", *usage.groups()))
            else:
                rows.add((-1, name, "", *usage.groups()))
        name = None if usage else name
    return [(f"step {s} {d} {t}" if s >= 0 else d) + f": REG {reg}, LOCAL {local} (spill bytes)"
            for s, d, t, reg, local in sorted(rows)]


def gpu_of_smi(text: str | None) -> str:
    """The GPU's name from nvidia-smi --query-gpu=name,... --format=csv (its header, then a row)."""
    rows = list(csv.reader((text or "").splitlines()))
    return rows[1][0].strip() if len(rows) > 1 and rows[0] and rows[0][0].strip() == "name" and rows[1] else ""


def json_lines(path: str) -> list:
    """The objects of a JSON Lines file ([] when it is not there; a line that is not JSON skipped)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return [o for o in out if isinstance(o, dict)]


# The record ------------------------------------------------------------------------------------

def timed_run(step: int, step_name: str, command: str, record: dict) -> dict:
    """One run of the record from what `stage11_hopper_kernel --bench --json` appended
    (common/src/stage.cpp append_run_record: B, H, Nq, Nk, d, causal, median_ms, gflops, pass,
    date, ...) and what that record lacks, which the command set: the step, its name, the dtype."""
    return {"step": step, "step_name": step_name, "dtype": TIMED_DTYPE, "B": record["B"], "H": record["H"],
            "d": record["d"], "N": record["Nq"], "causal": bool(record["causal"]), "median_ms": record["median_ms"],
            "tflops": record["gflops"] / 1000.0, "pass": record["pass"], "date": record["date"], "command": command}


def first_contact(log: str, gpu: str, ceilings: list, runs: list) -> dict:
    """The record read_first_contact() reads: the ceilings as {name: TFLOP/s} from wgmma_ceiling's
    JSON lines, whose GPU name is preferred to nvidia-smi's (gpu)."""
    return {"format": FORMAT, "version": 1, "log": log,
            "gpu": next((c["gpu"] for c in ceilings if c.get("gpu")), gpu),
            "ceilings": {c["name"]: c["value"] for c in ceilings if "name" in c and "value" in c},
            "runs": runs}


def write_json(path: str, record: dict):
    part = path + ".part"
    with open(part, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(part, path)


# The parts -------------------------------------------------------------------------------------

def toolkit(b: BringUp) -> str:
    """The GPU and the compiler; the GPU's name."""
    b.section("GPU and toolkit")
    smi = b.read(["nvidia-smi", "--query-gpu=name,compute_cap,clocks.sm,clocks.max.sm,driver_version",
                     "--format=csv"])
    b.say(*(smi.splitlines()[:3] if smi is not None else ["nvidia-smi: not found, or past its limit"]))
    nvcc = b.read(["nvcc", "--version"])
    b.say(*(nvcc.splitlines()[-1:] if nvcc else ["nvcc: not found, or past its limit"]))
    return gpu_of_smi(smi)


def build_check(b: BringUp):
    b.section(f"build ({' '.join(TARGETS)})")
    b.say(f"built by bench/session.py before this run (with --no-build: those already in {b.build})")
    for target in TARGETS:
        if not os.access(b.exe(target), os.X_OK):
            b.say(f"MISSING target {target} ({b.exe(target)})")


def sass(b: BringUp):
    b.section("SASS: stage 11's kernels must use HGMMA (wgmma), stage 07's HMMA (mma.sync)")
    exe = b.exe("stage11_hopper_kernel")
    text = b.read(["cuobjdump", "-sass", exe], 300)
    if text is None:
        b.say("cuobjdump: not found, or past its limit")
        return
    groups = sass_counts(text)
    b.say(*sass_lines(groups))
    if not groups["stage 11"]["HGMMA"]:
        b.problems.append(f"no HGMMA in stage 11's kernels (cuobjdump -sass {exe})")
        b.say("FAIL: no HGMMA in stage 11's kernels")
    b.say(*register_lines(b.read(["cuobjdump", "-res-usage", exe], 300) or ""))


def check_steps(b: BringUp, steps) -> list:
    """Part 3: the steps of `steps` whose runs all ended before their limit."""
    b.section("3. each step on one small problem (d 64 bf16 bhnd; d 128 fp16 bnhd causal, Nq > Nk)")
    finished = []
    for s in steps:
        codes = [b.run(30, [b.exe("stage11_hopper_kernel"), "--step", s, *problem], SYNC) for problem in SMALL_PROBLEMS]
        if HUNG not in codes:
            finished.append(s)
    b.say(f"steps that finished: {joined(finished) or 'none'}")
    return finished


def timing(b: BringUp, timed, finished, names: dict, out: str, save) -> list:
    """Part 4: each run's record, save(runs) after each."""
    chosen = [s for s in timed if s == 0 or s in finished]
    b.section(f"4. timing: steps {' '.join(map(str, timed))} (those that finished: {joined(chosen) or 'none'}) "
              f"beside stage 07 (step 0), {TIMED_DTYPE}, B 1 H 16 N 4096")
    runs = []
    for d in (64, 128):
        for causal in (False, True):
            for s in chosen:
                path = os.path.join(out, f"stage11_bench_step{s}_d{d}" + ("_causal" if causal else "") + ".jsonl")
                if os.path.exists(path):
                    os.remove(path)  # --json appends
                argv = [b.exe("stage11_hopper_kernel"), "--step", s, *TIMED_SHAPE, "--head-dim", d,
                        *(["--causal"] if causal else []), "--bench", "--repeat", 20, "--reference", "never",
                        "--json", path]
                b.run(30, argv, keep=BENCH_LINE.search)
                records = json_lines(path)
                if records:
                    runs.append(timed_run(s, names.get(s, ""), shell_line(argv), records[-1]))
                    save(runs)
    return runs


def test_cases(finished) -> list:
    """Part 5's cases: the own cases of the steps past 3 first (the ones a bring-up is for), then
    those every step goes through, then steps 1 to 3's (the first bring-up's order)."""
    own = {s: f"*step {s} (*" for s in finished}
    return [own[s] for s in finished if s > 3] + list(SHARED_CASES) + [own[s] for s in finished if s <= 3]


def tests(b: BringUp, finished):
    b.section("5. the stage's tests, one test case at a time, while the budget lasts "
              f"(steps {joined(finished) or 'none'})")
    for case in test_cases(finished) if finished else []:
        b.run(120, [b.exe("test_stage11"), f"--test-case={case}"], {"FA_STAGE11_STEPS": joined(finished)})


def joined(steps) -> str:
    return ",".join(str(s) for s in steps)


def chosen_steps(text: str, names: dict, first: int) -> list:
    """--steps or --timed: all (first to the last step --help names), or comma-separated numbers."""
    if text == "all":
        return [s for s in names if s >= first]
    return [int(s) for s in text.split(",")]


def bring_up(b: BringUp, steps: str, timed: str, out: str, log: str) -> int:
    """Every part in order; the exit code."""
    os.makedirs(out, exist_ok=True)
    gpu = toolkit(b)
    build_check(b)
    sass(b)
    names = road_names(b.read([b.exe("stage11_hopper_kernel"), "--help"]))
    if not names:
        b.say(f"{TARGETS['stage11_hopper_kernel']} --help names no road: steps are not named, and 'all' is none")

    def save(runs, ceilings=()):
        write_json(os.path.join(out, RECORD), first_contact(log, gpu, list(ceilings), runs))

    b.section("1. host maps (descriptor, swizzle, fragments)")
    b.run(60, [b.exe("test_hopper_layouts")])
    b.section("2. each wrapper alone (TMA, mbarrier, wgmma SS / RS / transposed B)")
    b.run(120, [b.exe("test_hopper_wrappers")], SYNC)
    finished = check_steps(b, chosen_steps(steps, names, 1))
    runs = timing(b, chosen_steps(timed, names, 0), finished, names, out, save)
    tests(b, finished)

    b.section("6. the wgmma ceiling")
    path = os.path.join(out, CEILINGS)
    if os.path.exists(path):
        os.remove(path)
    b.run(30, [b.exe("wgmma_ceiling"), "--target-ms", 5, "--repeat", 20, "--json", path])
    save(runs, json_lines(path))
    lines, status = b.tally()
    b.section(f"done in {b.seconds()} s (budget {b.budget} s); {len(runs)} timed run(s) in {os.path.join(out, RECORD)}")
    b.say(*lines)
    return status


def step_list(text: str) -> str:
    if text != "all" and not re.fullmatch(r"[0-9]+(,[0-9]+)*", text):
        raise argparse.ArgumentTypeError(f"'{text}' is not all or comma-separated step numbers (like 1,2,3)")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build-gpu", help="the build folder holding TARGETS (default build-gpu)")
    p.add_argument("--steps", type=step_list, default="all",
                   help="steps checked on two small problems: all (1 to the last --help names; default) or 1,2,3")
    p.add_argument("--timed", type=step_list, default="0,3,4,5,6,7,8",
                   help="steps timed, those among the steps that finished and 0 (default 0,3,4,5,6,7,8)")
    p.add_argument("--budget", type=int, default=170, help="seconds for the whole run (default 170)")
    p.add_argument("--out", default="/tmp/fa-bringup11", help="where the records go (default /tmp/fa-bringup11)")
    p.add_argument("--log-name", default="bringup11.log",
                   help="the name of the file this output goes to, kept in the record (default bringup11.log)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.budget < LEAST_LEFT:
        parser().error(f"--budget {args.budget}: at least {LEAST_LEFT} seconds")
    return bring_up(BringUp(args.build, args.budget), args.steps, args.timed, args.out, args.log_name)


if __name__ == "__main__":
    sys.exit(main())
