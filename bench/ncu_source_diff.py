#!/usr/bin/env python3
"""Two kernels compared instruction by instruction: Nsight Compute's source page of each (`ncu -i
REPORT --page source --csv --print-source sass` of a report taken with `--section SourceCounters`)
summed by SASS opcode, for the instructions executed (warp level) and for the warp-state samples
that landed on each opcode. Where two kernels do the same work, the opcodes one executes more
often and the ones its warps stall on more often say what its extra time is made of: integer
divisions show as I2F, MUFU.RCP, F2I and IABS, branches as BSSY, BRA and BSYNC, a load waited for
by the store after it as samples on STS.

usage: ncu_source_diff.py [--csv TABLE.csv] LABEL=SOURCE.csv BASE=SOURCE.csv [TOP]
--csv writes both tables also as CSV: measure (instructions or samples), opcode ("all": the
kernels' totals), LABEL, BASE, difference; the rows printed, in their order. Used by
bench/session.py ncusource09 (stage 09's packed backward beside the dense one).
"""
import collections
import csv
import re
import sys

import ncu_pages

OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def read(path):
    """(instructions executed, warp samples) by opcode, from one source page."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if "Instructions Executed" in r)
    names = rows[header]
    col_source, col_inst = names.index("Source"), names.index("Instructions Executed")
    col_samples = names.index("Warp Stall Sampling (All Samples)")
    inst, samples = collections.Counter(), collections.Counter()
    for r in rows[header + 1:]:
        if len(r) <= max(col_inst, col_samples):
            continue
        m = OPCODE.match(r[col_source].strip())
        if not m:
            continue
        op = m.group(1)
        inst[op] += int(ncu_pages.number(r[col_inst]) or 0)  # "1,000", or empty where a counter is not sampled
        samples[op] += int(ncu_pages.number(r[col_samples]) or 0)
    return inst, samples


def table(title, a, b, la, lb, top):
    """Prints one table (the totals, then the `top` opcodes whose counts differ most); its rows
    (opcode, a, b, a - b), the totals first as opcode "all"."""
    ta, tb = sum(a.values()), sum(b.values())
    print(f"{title}: {la} {ta:,} against {lb} {tb:,} ({ta / tb:.3f}x)" if tb else f"{title}: {la} {ta:,}")
    print(f"  {'opcode':<10} {la:>14} {lb:>14} {'difference':>14}")
    rows = [("all", ta, tb, ta - tb)]
    for op in sorted(set(a) | set(b), key=lambda o: -abs(a[o] - b[o]))[:top]:
        print(f"  {op:<10} {a[op]:>14,} {b[op]:>14,} {a[op] - b[op]:>+14,}")
        rows.append((op, a[op], b[op], a[op] - b[op]))
    return rows


def main(argv):
    out = None
    if len(argv) > 1 and argv[0] == "--csv":
        out, argv = argv[1], argv[2:]
    if len(argv) < 2 or any("=" not in a for a in argv[:2]):
        sys.exit("usage: ncu_source_diff.py [--csv TABLE.csv] LABEL=SOURCE.csv BASE=SOURCE.csv [TOP]")
    (la, pa), (lb, pb) = (a.split("=", 1) for a in argv[:2])
    top = int(argv[2]) if len(argv) > 2 else 15
    (ia, sa), (ib, sb) = read(pa), read(pb)
    rows = [("instructions", *r) for r in table("instructions executed (warp level)", ia, ib, la, lb, top)]
    print()
    rows += [("samples", *r) for r in table("warp-state samples", sa, sb, la, lb, top)]
    if out:
        ncu_pages.write_csv(out, ["measure", "opcode", la, lb, "difference"], rows)


if __name__ == "__main__":
    main(sys.argv[1:])
