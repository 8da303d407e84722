#!/usr/bin/env python3
"""Nsight Compute counters of several kernels side by side: one row per counter, one column per
report (`label=path` of a report's raw page as CSV, the first launch in it; bench/session.py's
NAME_metrics.csv, bench/ncu_pages.py reads it).

Bytes are given in MB and durations in microseconds whatever unit the page gives; a counter a
report lacks prints as '-' (an empty cell in the CSV). The metrics a raw page adds to every
launch (device attributes, the profiler's statistics) are left out. Used by bench/session.py
ncuflash09 (the course's backward beside SDPA flash's, the kernel it has to beat), ncuvarlen09
and ncucudnn11 (stage 11 beside SDPA cuDNN's forward).

    ncu_side_by_side.py [--csv TABLE.csv] LABEL=RAW.csv [LABEL=RAW.csv ...]
    ncu_side_by_side.py --longest KERNELS.csv

--csv writes the table also as CSV: counter, unit, then one column per label. The second form
names the kernel that ran longest in a page of gpu__time_duration.sum (how ncucudnn11 finds the
attention kernel among those a library's call launches).
"""
import sys

import ncu_pages

# A counter measured in bytes or seconds is shown in the table's unit (ncu_pages.TABLE_UNITS).
_TABLE_UNIT = {**{u: "MB" for u in ncu_pages.TABLE_UNITS["MB"][0]}, **{u: "us" for u in ncu_pages.TABLE_UNITS["us"][0]}}


def read(path):
    """{counter: (value, unit)} of the first launch of one raw page, bytes in MB and times in us."""
    launch = ncu_pages.first_launch(path)
    if launch is None:
        return {}
    values = {}
    for name, (value, unit) in launch.counters().items():
        table_unit = _TABLE_UNIT.get(unit)
        values[name] = (launch.in_unit(name, table_unit), table_unit) if table_unit else (value, unit)
    return values


def longest(path):
    """The name of the kernel with the longest gpu__time_duration.sum on a page (a raw page, or a
    details page printed as CSV), or "" when there is none."""
    times = [(launch.in_unit("gpu__time_duration.sum", "us"), launch.kernel) for launch in ncu_pages.read_launches(path)]
    times = [t for t in times if t[0] is not None]
    return max(times)[1] if times else ""


def table(labels, tables):
    """(header, rows) of the side-by-side table: counter, unit, then each report's value (None: missing)."""
    names = []
    for t in tables:
        names += sorted(n for n in t if n not in names)
    rows = [(n, next(t[n][1] for t in tables if n in t), *(t[n][0] if n in t else None for t in tables)) for n in names]
    return ["counter", "unit", *labels], rows


def main(argv):
    if len(argv) == 2 and argv[0] == "--longest":
        print(longest(argv[1]))
        return
    out = None
    if len(argv) > 1 and argv[0] == "--csv":
        out, argv = argv[1], argv[2:]
    if not argv or any("=" not in a for a in argv):
        sys.exit("usage: ncu_side_by_side.py [--csv TABLE.csv] LABEL=RAW.csv [LABEL=RAW.csv ...] | --longest KERNELS.csv")
    labels, reports = zip(*(a.split("=", 1) for a in argv))
    header, rows = table(labels, [read(p) for p in reports])
    width = max([len(r[0]) for r in rows] or [10])
    print(f"{'counter':<{width}} {'unit':>6} " + " ".join(f"{label:>14}" for label in labels))
    for name, unit, *cells in rows:
        print(f"{name:<{width}} {unit:>6} " + " ".join(f"{c:>14,.2f}" if c is not None else f"{'-':>14}" for c in cells))
    if out:
        ncu_pages.write_csv(out, header, rows)


if __name__ == "__main__":
    main(sys.argv[1:])
