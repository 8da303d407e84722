"""The command line: `list` shows every experiment; `run` builds what the chosen experiments need
and runs them into one results folder. Exit 2 (bad input) names what was wrong and what is allowed,
before anything runs.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import registry, runner
from .experiment import format_value, resolve_params


class BadInput(Exception):
    """A request the driver refuses before running anything (exit 2)."""


def describe(exp) -> list:
    """One experiment's block for `list`: what it measures, builds, takes, writes and reports."""
    lines = [f"{exp.name}  (stage {exp.stage})", f"  measures: {exp.description}",
             f"  builds:   {' '.join(exp.targets) or 'nothing (no built binary)'}"]
    if exp.params:
        width = max(len(f"{k}={format_value(v)}") for k, v in exp.params.items())
        first = True
        for k, v in exp.params.items():
            text = f"{k}={format_value(v)}"
            lines.append(f"  {'params:' if first else '':9} {text:<{width}}  {exp.param_help.get(k, '')}")
            first = False
    else:
        lines.append("  params:   none")
    writes = f"results/{exp.name}/: " + ", ".join(exp.outputs) if exp.outputs else f"logs/{exp.name}.log only"
    lines += [f"  writes:   {writes}", f"  summary:  {exp.summary_text()}"]
    return lines


def cmd_list(names) -> int:
    exps = registry.experiments()
    chosen = names or list(exps)
    unknown = [n for n in chosen if n not in exps]
    if unknown:
        raise BadInput(f"unknown experiment {', '.join(unknown)}; experiments: {' '.join(exps)}")
    blocks = ["\n".join(describe(exps[n])) for n in chosen]
    print("\n\n".join(blocks))
    return 0


def parse_sets(sets, names) -> dict:
    """--set EXP.PARAM=VALUE items as {exp: {param: text}}; each EXP must be one this call runs."""
    out = {}
    for item in sets:
        key, eq, value = item.partition("=")
        exp, dot, param = key.partition(".")
        if not eq or not dot or not exp or not param:
            raise BadInput(f"--set {item}: expected EXP.PARAM=VALUE, like road11.steps=0,8,9")
        if exp not in names:
            raise BadInput(f"--set {item}: {exp} is not run in this call (it runs: {' '.join(names)})")
        out.setdefault(exp, {})[param] = value
    return out


def plan(names, sets) -> list:
    """[(experiment, params)] in the order given; BadInput for an unknown name or a bad value."""
    exps = registry.experiments()
    unknown = [n for n in names if n not in exps]
    if unknown:
        raise BadInput(f"unknown experiment {', '.join(unknown)}; experiments: {' '.join(exps)}")
    if len(set(names)) != len(names):
        raise BadInput(f"an experiment named twice: {' '.join(names)} (one results folder each)")
    by_exp = parse_sets(sets, names)
    try:
        return [(exps[n], resolve_params(exps[n], by_exp.get(n, {}))) for n in names]
    except ValueError as e:
        raise BadInput(str(e)) from None


def cmd_run(args) -> int:
    planned = plan(args.experiments, args.set)
    ctx = runner.Context(work=args.work, build=args.build, out=args.out, dry_run=args.dry_run)
    return runner.run_all(ctx, planned, tuning=args.tuning, do_build=not args.no_build, pack_every=args.pack_every)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/session.py", description=sys.modules[__package__].__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="every experiment: stage, what it measures, builds, parameters, outputs, summary")
    ls.add_argument("experiments", nargs="*", metavar="EXP")
    run = sub.add_parser("run", help="build what the experiments need, run them, pack the results")
    run.add_argument("experiments", nargs="+", metavar="EXP")
    run.add_argument("--set", action="append", default=[], metavar="EXP.PARAM=VALUE",
                     help="a parameter of one experiment of this call (lists: comma-separated)")
    run.add_argument("--dry-run", action="store_true", help="print every command (build and experiments), run none")
    run.add_argument("--out", default=os.environ.get("OUT") or "/tmp/fa-out",
                     help="where session.tgz and summary.txt go (default: $OUT, else /tmp/fa-out)")
    run.add_argument("--build", default="build-gpu", help="the build folder (default build-gpu; kept between calls)")
    run.add_argument("--work", default="/tmp/fa-session", help="logs/ and results/ (default /tmp/fa-session)")
    run.add_argument("--no-build", action="store_true", help="skip configure and build (a later call on a warm machine)")
    run.add_argument("--tuning", choices=("ON", "OFF"), default="ON",
                     help="FA_STAGE07_TUNING: stage 07's tile candidates, which `road` times (default ON)")
    run.add_argument("--pack-every", type=float, default=30.0, metavar="S",
                     help="seconds between packs of logs and results into session.tgz (default 30)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return cmd_list(args.experiments) if args.command == "list" else cmd_run(args)
    except BadInput as e:
        print(f"bench/session.py: {e}", file=sys.stderr)
        return 2
