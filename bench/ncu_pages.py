"""Nsight Compute's measurements read from its CSV pages, never from the text it prints.

A session exports each profile as a report (`ncu --export NAME --force-overwrite ...`, NAME.ncu-rep)
and prints its raw page from it as CSV:

    ncu --import NAME.ncu-rep --csv --page raw --print-units base > NAME.csv

The raw page holds every collected metric of every profiled launch, one row per launch. Its
first row names the columns: the launch's identity ("ID", "Process ID", "Process Name", "Host
Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size", "Device", "CC"), then one
column per metric by its raw name (`gpu__time_duration.sum`, `launch__registers_per_thread`,
`device__attribute_display_name`, ...). The second row gives each metric's unit, its identity
cells empty. Nsight Compute's manual says --csv implies --print-units base; we pass it anyway,
so every value is in its base unit (byte, nsecond, ...) whatever the version.

read_launches() is tolerant where the manual leaves the format open: a units row or none, lines
before the header (a profiler's notice), numbers with thousands separators, "n/a" and other text
kept as text. It also reads the details page printed as CSV (`ncu --csv --metrics ...` without
--page: one row per launch and metric, "Metric Name", "Metric Unit", "Metric Value"), the layout
of a kernel listing. Python 3 standard library only: the session driver runs it on the GPU
machine, the tests and docs/results_pages/ on any machine.
"""
from __future__ import annotations

import csv
import dataclasses

# Columns of a launch's identity; every metric's raw name holds "__" (unit__counter...), none of these.
IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC")

# Families of metrics the raw page holds for every launch, asked for or not.
AUTOMATIC = ("device__", "profiler__", "numa__", "nvlink__")

# Each unit Nsight Compute may print a byte count or a duration in, as a multiple of the base unit.
_BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
_SECONDS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
            "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# What a table reports them in, MB (10^6 bytes) and microseconds: (the family's units, the table's
# unit in bytes or seconds, the unit --print-units base gives).
TABLE_UNITS = {"MB": (_BYTES, 1e6, "byte"), "us": (_SECONDS, 1e-6, "nsecond")}


@dataclasses.dataclass
class Launch:
    """One profiled launch: its identity cells by column name, and metric name -> (value, unit),
    value a float, or the text when it is not a number ("n/a", "PolicySpread", instanced lists)."""
    info: dict
    metrics: dict

    @property
    def kernel(self) -> str:
        return self.info.get("Kernel Name", "")

    def signature(self) -> str:
        """The kernel with its launch shape, as the details page heads a launch: NAME (GRID)x(BLOCK)."""
        grid, block = self.info.get("Grid Size", ""), self.info.get("Block Size", "")
        return f"{self.kernel} {grid}x{block}" if grid and block else self.kernel

    def counters(self) -> dict:
        """The numeric metrics but those a raw page adds to every launch whatever was asked
        (device attributes, the profiler's own statistics, NUMA and NVLink topology)."""
        return {n: v for n, v in self.metrics.items() if isinstance(v[0], float) and not n.startswith(AUTOMATIC)}

    def value(self, name: str):
        """The metric's value as a float, None when the launch lacks it or it is not a number."""
        v = self.metrics.get(name, (None, ""))[0]
        return v if isinstance(v, float) else None

    def in_unit(self, name: str, unit: str):
        """The metric in `unit` (MB or us) from whatever unit it was printed in; None when missing.
        A value without a unit (a page without its units row) is taken as in the base unit (byte,
        nsecond), what --print-units base gives."""
        v = self.value(name)
        if v is None:
            return None
        factors, per, base = TABLE_UNITS[unit]
        return v * factors.get(self.metrics[name][1] or base, factors[base]) / per


def number(text: str):
    """A cell as a float ("1,296,687,104" -> 1296687104.0), None when it is not a number."""
    t = text.strip().replace(",", "")
    if not t:
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _cell(text: str):
    n = number(text)
    return n if n is not None else text.strip()


def _rows(path: str) -> list:
    """The CSV rows of a page from its header on (the first row naming "Kernel Name"); none when
    the file holds no page."""
    with open(path, newline="", errors="replace") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "ID" in r), None)
    return [] if start is None else rows[start:]


def read_launches(path: str) -> list:
    """The launches of a raw page (or of a details page printed as CSV), in the page's order."""
    rows = _rows(path)
    if not rows:
        return []
    head = rows[0]
    if "Metric Name" in head and "Metric Value" in head:
        return _read_details(head, rows[1:])
    metric_cols = [i for i, name in enumerate(head) if "__" in name]
    ident_cols = [i for i, name in enumerate(head) if "__" not in name]
    body, units = rows[1:], {}
    kernel = head.index("Kernel Name")
    if body and not body[0][kernel].strip() and not body[0][head.index("ID")].strip():
        units = {head[i]: body[0][i].strip() for i in metric_cols if i < len(body[0])}
        body = body[1:]
    out = []
    for r in body:
        if len(r) < len(head):  # a line of the program's own output between the rows
            continue
        info = {head[i]: r[i] for i in ident_cols if i < len(r)}
        metrics = {head[i]: (_cell(r[i]), units.get(head[i], "")) for i in metric_cols if i < len(r)}
        out.append(Launch(info, metrics))
    return out


def _read_details(head: list, body: list) -> list:
    """The details page as CSV: one row per (launch, metric), gathered by launch ID."""
    col = {name: i for i, name in enumerate(head)}
    launches = {}
    for r in body:
        if len(r) < len(head):
            continue
        launch = launches.get(r[col["ID"]])
        if launch is None:
            launch = launches[r[col["ID"]]] = Launch({k: r[col[k]] for k in IDENTITY if k in col}, {})
        launch.metrics.setdefault(r[col["Metric Name"]], (_cell(r[col["Metric Value"]]), r[col["Metric Unit"]].strip()))
    return list(launches.values())


def first_launch(path: str):
    """The first launch of a page (a report of one profiled launch), None when there is none or
    the file is missing."""
    try:
        launches = read_launches(path)
    except OSError:
        return None
    return launches[0] if launches else None


def _out(cell) -> str:
    """A table's cell as written: None empty, a float with 12 significant digits (834.016, not
    834.0160000000001; 81730528, not 81730528.0)."""
    if cell is None:
        return ""
    return f"{cell:.12g}" if isinstance(cell, float) else str(cell)


def write_csv(path: str, header, rows) -> None:
    """A table as CSV: the header row, then each row."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for r in rows:
            w.writerow([_out(c) for c in r])
