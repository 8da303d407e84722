#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by line of CUDA source: Nsight Compute's source page
printed with its CUDA lines (`ncu -i REPORT --page source --csv --print-source cuda,sass` of a
report taken with `--section SourceCounters` from a build with -lineinfo). Each row of that page
is a source line or one of its SASS instructions; the warp-state samples of a line are those of
its instructions. The report lists the lines with the most samples, each with its share of the
kernel's samples and its instructions executed; with the SASS page beside it (`--print-source
sass`, read by ncu_source_diff.py), also the kernel's total, which the lines exceed: an
instruction inlined from another file counts under a line of each file it passes through.

With --snippets SOURCE, the samples are also summed over each region of SOURCE between a pair of
Doxygen snippet markers (`//! [name]`), the pieces the lesson quotes: what share of the kernel's
samples the softmax, the epilogue or the producer's loop holds (regions may nest; each counts the
lines of SOURCE itself, where an inlined helper's instructions are attributed to the line that
calls it).

usage: ncu_source_lines.py LABEL=CUDA_PAGE.csv[,SASS_PAGE.csv] ... [--top N] [--snippets SOURCE] [--csv TABLE.csv]
--csv writes what is printed also as CSV, one row per figure: label, kind (total: the samples on
lines with a source line; sass_total: the SASS page's samples; snippet_total: the samples on the
lines of SOURCE; snippet; line), name (the snippet's), file (its base name), first and last line
(a line's number in first), samples, executed, share_pct (of the label's total, or for a snippet
of SOURCE's), text (the source line). Used by bench/session.py ncusource11 (stage 11's kernel per
source line).
"""
import csv
import os
import re
import sys

import ncu_pages
import ncu_source_diff

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    """A counter's cell as a float, 0 where it is empty or not a number."""
    return ncu_pages.number(text) or 0.0


def read(path):
    """[file, line, text, samples, instructions] per CUDA source line of a page
    printed with --print-source cuda,sass: blocks that open with a "File Path" row, each with a
    header ("Line No", "Source", "Address", "Source", counters...), a row per source line and,
    under each line with code, a row per SASS instruction (no line number, an address). A line's
    figures are the sums of its instructions' rows."""
    with open(path, newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    out, file, header, current = [], "?", None, None
    for r in rows:
        if not r:
            continue
        if r[0] == "File Path":
            file, current = (r[1] if len(r) > 1 else "?"), None
            continue
        if SAMPLES in r:
            header = r
            col = {name: i for i, name in reversed(list(enumerate(header)))}  # the first column of each name
            continue
        if header is None or "Line No" not in col:
            continue
        if r[0].strip().isdigit():  # a source line
            current = [file, r[0].strip(), r[1].strip(), 0.0, 0.0]
            out.append(current)
            continue
        address = r[col["Address"]] if col["Address"] < len(r) else ""
        if current is None or address in ("", "-", "..."):
            continue
        current[3] += number(r[col[SAMPLES]]) if col[SAMPLES] < len(r) else 0.0
        if EXECUTED in col and col[EXECUTED] < len(r):
            current[4] += number(r[col[EXECUTED]])
    if not out:
        raise ValueError(f"{path}: no source lines (was it printed with --print-source cuda,sass from a -lineinfo build?)")
    return out


def snippets(source):
    """{name: (first line, last line)} of the `//! [name]` pairs in `source`."""
    opened, regions = {}, {}
    with open(source, errors="replace") as f:
        for number_, text in enumerate(f, start=1):
            m = re.match(r"\s*//! \[(\w+)\]", text)
            if not m:
                continue
            name = m.group(1)
            if name in opened:
                regions[name] = (opened.pop(name), number_)
            else:
                opened[name] = number_
    return regions


def option(argv, name):
    """The value of option `name` and argv without it (None if absent)."""
    if name not in argv:
        return None, argv
    k = argv.index(name)
    return argv[k + 1], argv[:k] + argv[k + 2:]


CSV_HEADER = ["label", "kind", "name", "file", "first", "last", "samples", "executed", "share_pct", "text"]


def main(argv):
    top, argv = option(argv, "--top")
    top = int(top or 30)
    source, argv = option(argv, "--snippets")
    out, argv = option(argv, "--csv")
    regions = snippets(source) if source else {}
    rows = []  # the CSV's rows (CSV_HEADER), what is printed
    for arg in argv:
        label, paths = arg.split("=", 1)
        path, _, sass_path = paths.partition(",")
        try:
            entries = read(path)
        except (OSError, ValueError) as e:
            print(f"{label}: {e}")
            continue
        total = sum(e[3] for e in entries) or 1.0
        print(f"\n== {label}: {int(total)} warp samples on instructions with a source line; the {top} lines with the most "
              f"(file:line; a line inlined in several places sums them)")
        rows.append([label, "total", "", "", "", "", int(total), "", "", ""])
        if sass_path:
            try:
                every = sum(ncu_source_diff.read(sass_path)[1].values())
                print(f"   (the SASS page: {int(every)} samples in all; an instruction inlined from another file counts "
                      f"under a line of each file it passes through, so the lines of all files sum to more)")
                rows.append([label, "sass_total", "", "", "", "", int(every), "", "", ""])
            except (OSError, StopIteration, ValueError) as e:
                print(f"   ({sass_path}: {e})")
        if regions:
            base = os.path.basename(source)
            mine = [e for e in entries if os.path.basename(e[0]) == base]
            in_file = sum(e[3] for e in mine) or 1.0
            print(f"   by snippet of {base} (share of the samples on its lines, {int(sum(e[3] for e in mine))} in all):")
            rows.append([label, "snippet_total", "", base, "", "", int(sum(e[3] for e in mine)), "", "", ""])
            for name, (first, last) in sorted(regions.items(), key=lambda kv: kv[1]):
                part = sum(e[3] for e in mine if first <= int(e[1]) <= last)
                if part == 0:
                    continue  # a snippet this kernel instance does not run
                print(f"     {name:24} lines {first:5}-{last:<5} {int(part):8d} samples  {100 * part / in_file:5.1f} %")
                rows.append([label, "snippet", name, base, first, last, int(part), "", round(100 * part / in_file, 1), ""])
        print(f"{'share':>6} {'samples':>8} {'executed':>11}  {'where':28} line")
        for file, line, text, samples, executed in sorted(entries, key=lambda e: -e[3])[:top]:
            where = f"{os.path.basename(file)}:{line}"
            print(f"{100 * samples / total:5.1f}% {int(samples):8d} {int(executed):11d}  {where:28} {text[:90]}")
            rows.append([label, "line", "", os.path.basename(file), int(line), "", int(samples), int(executed),
                         round(100 * samples / total, 1), text])
    if out:
        ncu_pages.write_csv(out, CSV_HEADER, rows)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
