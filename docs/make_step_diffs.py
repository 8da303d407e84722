#!/usr/bin/env python3
"""Writes the difference between two consecutive reading files of a stage's road as a unified
diff, which the lesson shows with \\verbinclude: what one step adds over the one before.

    python3 docs/make_step_diffs.py --out stage11_step2_diff.txt steps/step1_wgmma.cu steps/step2_tma_ring.cu

The files are named by their last two path components, so the page shows no build paths; three
lines of context around each change.
"""
import argparse
import difflib
import os
import sys


def label(path):
    """`steps/step1_wgmma.cu` for /any/where/steps/step1_wgmma.cu."""
    return "/".join(os.path.normpath(path).split(os.sep)[-2:])


def diff_text(before, after):
    """The unified diff of two files, as text ending in a newline ("" when they are equal)."""
    with open(before, encoding="utf-8") as f:
        a = f.read().splitlines(keepends=True)
    with open(after, encoding="utf-8") as f:
        b = f.read().splitlines(keepends=True)
    lines = difflib.unified_diff(a, b, fromfile=label(before), tofile=label(after), n=3)
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the diff file to write")
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    text = diff_text(args.before, args.after)
    if not text:
        print(f"make_step_diffs: {args.before} and {args.after} are the same file", file=sys.stderr)
        return 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
