"""compute-sanitizer over each stage's executables: the cases of the bash driver's `sanitize`,
one experiment per stage set (sanitize05 ... sanitize11, sanitize07m, sanitize09m) and `sanitize`
(common.py) for several in one results folder, as SANITIZE_STAGES did.

Each run is `timeout 300 compute-sanitizer --tool TOOL --error-exitcode 9 [--leak-check full] EXE
ARGS [--reference never]`, appended to the results folder's sanitize_stage<S>_<tool>.log under a
line naming it; exit 77 (the executable skips: no Hopper GPU) is not a failure. SANITIZE_TOOLS,
SANITIZE09_STEPS, SANITIZE11_STEPS and SANITIZE09M_CASES became parameters.
"""
from __future__ import annotations

import glob
import os
import re

from .experiment import Command, Experiment, Where, file_lines
from .runner import SessionError

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
TOOLS_HELP = "compute-sanitizer's tools, each over every case (SANITIZE_TOOLS)"

# Small problems with tails, Nq != Nk, rows and whole query tiles that see no key.
CASES = (
    "--seq-q 77 --seq-k 93 --heads 2 --head-dim 32",
    "--seq-q 130 --seq-k 70 --heads 1 --head-dim 64 --causal --layout bnhd",
    "--seq-q 300 --seq-k 100 --batch 2 --head-dim 128 --causal",
    "--seq-q 65 --seq-k 129 --head-dim 128 --layout bnhd",
)
# Stage 07 adds d = 256 (Nq > Nk, causal: the first 23 rows see no key), fp16, and the first step
# of its road (plain shared loads, no pipeline), whose code paths the final kernel does not take.
CASES07 = CASES + (
    "--seq-q 100 --seq-k 77 --heads 2 --head-dim 256 --causal",
    "--seq-q 77 --seq-k 93 --heads 2 --head-dim 64 --causal --dtype fp16",
    "--seq-q 130 --seq-k 70 --head-dim 128 --causal --layout bnhd --step 0",
)
# Stage 07's kernels with stage 10's switches, through test_stage07's cases (doctest filters).
CASES07M = ("-tc=*packed*batches*", "-tc=*grouped-query*", "-tc=*dropout*dense*packed*")
# Stage 09's default main kernel with stage 10's switches, through test_stage09's cases of them.
# A parameter's list is comma-separated and a doctest filter holds commas: "|" separates them.
CASES09M = "|".join((
    "-tc=*stage?10?s?switches?matches*",
    "-tc=*packed?batches?of*",
    "-tc=*stage?09?with?dropout*,*regenerates?stage?07?s?dropout?mask*",
    "-tc=*group?split*",
))
CASES09M_HELP = "test_stage09's doctest filters, separated by | (SANITIZE09M_CASES, there space-separated)"
# Stage 09 (the backward): tails, Nq < Nk and Nq > Nk, both layouts, d 64 and 128, causal rows that
# see no key, both dQ modes, fp16 once; each with every main kernel of the road (--step).
CASES09 = (
    "--seq-q 200 --seq-k 333 --heads 2 --head-dim 64",
    "--seq-q 333 --seq-k 200 --head-dim 128 --causal --deterministic",
    "--seq-q 200 --seq-k 333 --batch 2 --head-dim 128 --layout bnhd",
    "--seq-q 333 --seq-k 200 --heads 2 --head-dim 64 --causal --layout bnhd",
    "--seq-q 200 --seq-k 333 --head-dim 64 --causal --deterministic --dtype fp16",
)
# Stage 05's road: every earlier step once, on a problem with tails, Nq > Nk and causal rows that see no key.
CASE05_ROAD = "--seq-q 130 --seq-k 77 --heads 2 --head-dim 64 --causal --step"
# Stage 11 (every step from 1: step 0 is stage 07's kernel): tails, Nq != Nk, causal rows that see
# no key, bnhd, fp16, d 64 and 128; more query tiles than SMs (step 9's blocks loop over several).
CASES11 = (
    "--seq-q 200 --seq-k 333 --heads 2 --head-dim 64",
    "--seq-q 333 --seq-k 200 --head-dim 128 --causal",
    "--seq-q 130 --seq-k 77 --heads 2 --head-dim 64 --causal --layout bnhd",
    "--seq-q 200 --seq-k 333 --batch 2 --head-dim 128 --layout bnhd --dtype fp16",
    "--seq-q 77 --seq-k 93 --head-dim 64 --causal --dtype fp16",
    "--seq-q 400 --seq-k 150 --batch 3 --heads 60 --head-dim 128 --causal --layout bnhd",
)
STEPS_HELP = "steps of the road (--step): all (every step its --help names), or numbers"

# stage -> (executable in the build folder, its target)
EXES = {
    "05": ("stages/05_shared_memory_kernel/stage05_shared_memory_kernel", "stage05_shared_memory_kernel"),
    "06": ("stages/06_causal_masking/stage06_causal_masking", "stage06_causal_masking"),
    "07": ("stages/07_pipelined_fused_kernel/stage07_pipelined_fused_kernel", "stage07_pipelined_fused_kernel"),
    "07m": ("tests/test_stage07", "test_stage07"),
    "09": ("stages/09_backward_kernel/stage09_backward_kernel", "stage09_backward_kernel"),
    "09m": ("tests/test_stage09", "test_stage09"),
    "11": ("stages/11_hopper_kernel/stage11_hopper_kernel", "stage11_hopper_kernel"),
    "11r": ("tests/test_stage11_steps", "test_stage11_steps"),
    "12": ("stages/12_hopper_backward/stage12_hopper_backward", "stage12_hopper_backward"),
    "13": ("stages/13_decode/stage13_decode", "stage13_decode"),
}
# Stage 11's reading files (steps/: steps 1-4 and 9) beside their switch steps, through
# test_stage11_steps' small case: the one racecheck can cover whole in a few minutes.
CASES11R = ("-tc=*two?small?problems*",)
# Stage 12 (the Hopper backward; step 0 is stage 09's, sanitized as stage 09): tails, Nq < Nk and
# Nq > Nk (causal rows that see no key), both layouts and types, d 64 and 128, more key blocks than
# one ring's worth of query tiles.
CASES12 = (
    "--seq-q 130 --seq-k 77 --heads 2 --head-dim 64 --causal",
    "--seq-q 77 --seq-k 200 --batch 2 --head-dim 128 --layout bnhd --dtype fp16",
    "--seq-q 333 --seq-k 200 --head-dim 128 --causal",
)
# Stage 13 (decoding): a ragged paged batch with an empty sequence and causal new rows, grouped
# heads 4:1 and MQA, a contiguous cache split by --splits, page sizes 16 and 256, both types; the
# serving loop (its prefill, the pages written, decode steps with pages taken and freed).
CASES13 = (
    "--cache-seqlens 0,70,300 --seq-q 3 --heads 8 --kv-heads 2 --head-dim 128 --page-size 16",
    "--cache-seqlens 1000 --heads 4 --kv-heads 1 --head-dim 64 --cache contiguous --splits 5",
    "--batch 2 --seq-k 130 --heads 32 --kv-heads 4 --head-dim 128 --page-size 256 --dtype fp16 --no-append",
    "--serve --requests 12 --max-batch 4 --prompt-min 1 --prompt-max 200 --decode-steps 10 --page-size 16 --heads 8 "
    "--kv-heads 2 --head-dim 64",
)
# Stage 12's first step with the deterministic order (stages/12_hopper_backward/launch.cuh).
FIRST_DETERMINISTIC_STEP12 = 3
OUTPUT = "sanitize_stage{stage}_{tool}.log"
# The line commands() writes above each run ("== memcheck EXE ARGS"); a stage's own banner
# ("== flashcourse stage 12: ...") is part of the run.
RUN_HEADER = re.compile(r"^== (" + "|".join(TOOLS) + r") ")


def check_steps(steps):
    if steps != ("all",) and not all(s.isdigit() for s in steps):
        raise ValueError(f"steps must be all or step numbers (like 1,3), not {','.join(steps)}")


def check_tools(p):
    bad = [t for t in p["tools"] if t not in TOOLS]
    if bad:
        raise ValueError(f"tools are {', '.join(TOOLS)}, not {','.join(bad)}")
    for key in ("steps", "steps09", "steps11", "steps12"):
        if key in p:
            check_steps(p[key])


def last_step(ctx, stage: str):
    """The last step of the stage's road from its --help ("--step INT:INT in [0 - N]"); None where
    it does not say (a dry run: a placeholder)."""
    exe = ctx.exe(EXES[stage][0])
    found = re.search(r"--step INT:INT in \[0 - ([0-9]+)\]", ctx.help_text(exe) or "")
    return int(found.group(1)) if found else None


def road_steps(ctx, stage: str, steps, first: int):
    """The steps to sanitize and the line that says so: the given numbers, or first..last."""
    last = last_step(ctx, stage)
    name = os.path.basename(EXES[stage][0])
    if steps != ("all",):
        chosen = list(steps)
    elif ctx.dry_run and last is None:
        chosen = [f"<steps-{first}-to-last-of-{name}--help>"]
    elif stage == "09":  # first..last, or step 0 alone where --help names no range
        chosen = [str(s) for s in range(first, (last or 0) + 1)]
    elif last is None:  # no range in --help: no steps to guess (probing --step 1, 2, ... is not done)
        raise SessionError(f"could not read the last step of stage {stage}'s road from {name} --help")
    else:
        chosen = [str(s) for s in range(first, last + 1)]
    top = last if last is not None else "?"
    note = f"stage {stage}: road steps {' '.join(chosen)} (of {first} to {top}, from {name} --help)"
    return chosen, note


def cases(stage: str, p: dict, ctx):
    """The stage's cases (argument strings) and a line to open its logs with (or None)."""
    if stage == "05":
        return list(CASES) + [f"{CASE05_ROAD} {s}" for s in range(6)], None
    if stage == "06":
        return list(CASES), None
    if stage == "07":
        return list(CASES07), None
    if stage == "07m":
        return list(CASES07M), None
    if stage == "11r":
        return list(CASES11R), None
    if stage == "09m":
        return p["cases09m"].split("|"), None
    if stage == "09":
        steps, note = road_steps(ctx, "09", p["steps09"], 0)
        return [f"{c} --step {s}" for c in CASES09 for s in steps], note
    if stage == "11":
        steps, note = road_steps(ctx, "11", p["steps11"], 1)
        return [f"{c} --step {s}" for s in steps for c in CASES11], note
    if stage == "12":
        steps, note = road_steps(ctx, "12", p["steps12"], 1)
        # From step 3 (the dQ writer) each case runs again in the deterministic order: the turns'
        # acquiring loads, the completed reductions, the increments.
        return [f"{c} --step {s}{d}" for s in steps for d in ("", " --deterministic")
                if not d or str(s).isdigit() and int(s) >= FIRST_DETERMINISTIC_STEP12 for c in CASES12], note
    if stage == "13":
        return list(CASES13), None
    raise SessionError(f"sanitize: no stage {stage}")


def commands(stage: str, p: dict, ctx, out: str) -> list:
    """Every tool over every case of the stage, each run appended to the tool's log in out."""
    exe = ctx.exe(EXES[stage][0])
    runs, note = cases(stage, p, ctx)
    cmds = []
    for tool in p["tools"]:
        log = os.path.join(out, OUTPUT.format(stage=stage, tool=tool))
        for i, args in enumerate(runs):
            argv = ("timeout", str(p.get("limit", 300)), "compute-sanitizer", "--tool", tool, "--error-exitcode", "9",
                    *(("--leak-check", "full") if tool == "memcheck" else ()), exe, *args.split(),
                    *(() if stage.endswith(("m", "r")) else ("--reference", "never")))
            head = ((note,) if note and i == 0 else ()) + (f"== {tool} {os.path.basename(exe)} {args}",)
            cmds.append(Command(argv, stdout=log, append=True, header=head, ok=(0, 77)))
    return cmds


def summary(where: Where) -> list:
    """Per tool log: the runs that reached no sanitizer summary (skipped: exit 77, or cut short) with
    their first skip line, then each distinct ERROR/RACECHECK/LEAK SUMMARY line with its count."""
    lines = []
    for log in sorted(glob.glob(os.path.join(where.results, "sanitize_stage*.log"))):
        counts, run, seen = {}, None, False
        for line in file_lines(log) + ["== end"]:
            if RUN_HEADER.match(line) or line == "== end":
                if run and not seen:
                    lines.append(f"no summary  {run[0][3:]}: " + next(
                        (x for x in run[1:] if re.search("skip|needs", x, re.I)), "(see the log)"))
                run, seen = [line], False
            elif re.search("ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY", line):
                counts[line] = counts.get(line, 0) + 1
                seen = True
            elif run is not None:
                run.append(line)
        lines.append(f"-- {os.path.basename(log)}")
        lines += [f"{n:7d} {text}" for text, n in sorted(counts.items())]
    return lines


def _stage_params(stage: str):
    """The parameters of one stage's experiment beside its tools: (defaults, help, key in cases())."""
    if stage in ("09", "11", "12"):
        return {"steps": ("all",)}, {"steps": STEPS_HELP + f" (SANITIZE{stage}_STEPS)"}, f"steps{stage}"
    if stage == "09m":
        return {"cases": CASES09M}, {"cases": CASES09M_HELP}, "cases09m"
    if stage == "11r":  # racecheck over the whole case takes minutes, not seconds
        return {"limit": 600}, {"limit": "seconds before timeout stops one tool's run"}, "limit"
    return {}, {}, None


def experiment(stage: str, description: str):
    """sanitize<stage>: the stage's cases under each tool, its logs in its results folder."""
    extra, extra_help, key = _stage_params(stage)
    name = f"sanitize{stage}"

    def _commands(p, ctx):
        q = dict(p)
        if key:
            q[key] = p[next(iter(extra))]
        return commands(stage, q, ctx, ctx.results(name))

    return Experiment(
        name=name,
        stage=stage.rstrip("mr"),
        description=description,
        targets=(EXES[stage][1],),
        params={"tools": TOOLS, **extra},
        param_help={"tools": TOOLS_HELP, **extra_help},
        commands=_commands,
        outputs=(OUTPUT.format(stage=stage, tool="{tool}"),),
        summary=summary,
        check=check_tools,
    )
