#!/usr/bin/env python3
"""Nsight Compute counters of several kernels side by side: one row per counter, one column per
report (`label=path` of an `ncu --metrics` output, as gpu_session.sh writes *_metrics.txt).

Bytes are given in MB and durations in microseconds whatever unit ncu chose; a counter a report
lacks prints as '-'. Used by bench/gpu_session.sh ncuflash09 (the course's backward beside SDPA
flash's, the kernel it has to beat) and ncucudnn11 (stage 11 beside SDPA cuDNN's forward).

    ncu_side_by_side.py LABEL=METRICS.txt [LABEL=METRICS.txt ...]
    ncu_side_by_side.py --longest KERNELS.csv

The second form names the kernel that ran longest in `ncu --csv --metrics gpu__time_duration.sum`
output (how ncucudnn11 finds the attention kernel among those a library's call launches).
"""
import csv
import re
import sys

SCALE = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "Tbyte": 1e6,
         "ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
UNIT = {"byte": "MB", "Kbyte": "MB", "Mbyte": "MB", "Gbyte": "MB", "Tbyte": "MB",
        "ns": "us", "nsecond": "us", "us": "us", "usecond": "us", "ms": "us", "msecond": "us", "s": "us", "second": "us"}
ROW = re.compile(r"^\s*([a-z][a-z0-9_]*__[A-Za-z0-9_.]+)\s+(?:(\S+)\s+)?([0-9][0-9,]*(?:\.[0-9]+)?)\s*$")


def read(path):
    """{counter: (value, unit)} of one report; the first kernel's rows only."""
    values = {}
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if not m:
                continue
            name, unit, value = m.group(1), m.group(2) or "", float(m.group(3).replace(",", ""))
            if name in values:
                break  # a second kernel's rows
            values[name] = (value * SCALE.get(unit, 1.0), UNIT.get(unit, unit))
    return values


def longest(path):
    """The name of the kernel with the longest gpu__time_duration.sum in an `ncu --csv` listing (its
    quoted lines; the program's own output between them is skipped), or "" when there is none."""
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    times = [(float(r["Metric Value"].replace(",", "")) * SCALE.get(r["Metric Unit"], 1.0), r["Kernel Name"]) for r in rows
             if r.get("Metric Name") == "gpu__time_duration.sum"]
    return max(times)[1] if times else ""


def main(argv):
    if len(argv) == 2 and argv[0] == "--longest":
        print(longest(argv[1]))
        return
    if not argv or any("=" not in a for a in argv):
        sys.exit("usage: ncu_side_by_side.py LABEL=METRICS.txt [LABEL=METRICS.txt ...] | --longest KERNELS.csv")
    labels, reports = zip(*(a.split("=", 1) for a in argv))
    tables = [read(p) for p in reports]
    names = []
    for t in tables:
        names += [n for n in t if n not in names]
    width = max(len(n) for n in names) if names else 10
    print(f"{'counter':<{width}} {'unit':>6} " + " ".join(f"{l:>14}" for l in labels))
    for n in names:
        unit = next((t[n][1] for t in tables if n in t), "")
        cells = [f"{t[n][0]:>14,.2f}" if n in t else f"{'-':>14}" for t in tables]
        print(f"{n:<{width}} {unit:>6} " + " ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
