"""Nsight Compute's records of docs/results/ read as data, in the two CSV forms they come in:

- the reports that were once printed as text (ncu_*.csv converted from them): long form, one row
  per printed metric, columns part,launch,section,metric,unit,value. part is the "== name =="
  (or "---- name") header of the file's part, empty when it has none; launch the number of the
  profiled launch in the file (1, 2, ...), whose first row, of section "launch" and metric "kernel",
  holds the kernel's signature with its grid and block as its value (once, not on every row);
  section the section's name, empty for --metrics counters;
  metric a raw name (sm__..., smsp__..., l1tex__, gpu__, launch__, dram__, lts__) or a section's
  display name ("Registers Per Thread", "Duration"); value a plain number, or the text ("n/a",
  "PolicySpread") when it is not one.
- the raw pages bench/session.py writes from its reports (ncu --import NAME.ncu-rep --csv --page
  raw --print-units base: one row per profiled launch, one column per metric by raw name, a row of
  units under the header; bench/ncu_pages.py reads it, make_results.py puts bench/ on sys.path).

read_ncu_parts() gives a long-form file as the text reader of the Nsight dumps it was converted from
gave them (per part, the first value of each name); read_ncu_metrics() takes either form, as read_ncu_report() took the text.
"""

import csv
import os
from collections import OrderedDict

import ncu_pages  # bench/ncu_pages.py

LONG_FORM = ["part", "launch", "section", "metric", "unit", "value"]


def _header(path):
    """The first row of a CSV file (its column names); [] when it is empty."""
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


def read_ncu_parts(path):
    """A long-form Nsight Compute record: for each part (in file order), every metric it holds as
    (value as a float, unit or ""), the first occurrence of a name kept and a text value left out;
    {} when the file is not there. ValueError when the file is not in the long form."""
    parts = OrderedDict()
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.DictReader(f)
            if rows.fieldnames != LONG_FORM:
                raise ValueError(f"{path}: not a long-form Nsight Compute record (columns {','.join(LONG_FORM)})")
            for r in rows:
                value = ncu_pages.number(r["value"])
                metrics = parts.setdefault(r["part"], {})
                if value is not None:
                    metrics.setdefault(r["metric"], (value, r["unit"]))
    except OSError:
        return {}
    return parts


def read_ncu_launches(path):
    """A raw page the session driver wrote: one dict per profiled launch, in page order, of metric
    -> (value, unit), value a float or the text when it is not a number; the launch's identity
    cells under their column names ("Kernel Name", "Grid Size", ...) as (text, ""). [] when the file
    is not there."""
    try:
        launches = ncu_pages.read_launches(path)
    except OSError:
        return []
    out = []
    for launch in launches:
        d = OrderedDict((k, (v, "")) for k, v in launch.info.items())
        d.update(launch.metrics)
        out.append(d)
    return out


def read_ncu_metrics(results_dir, *names):
    """Every numeric metric of the Nsight Compute records `names` of results_dir, long-form files
    (their parts merged) and raw pages (their launches merged) alike, as (value, unit): the first
    file, then the first part or launch that holds a name, wins. A missing file adds nothing."""
    metrics = {}
    for name in names:
        path = os.path.join(results_dir, name)
        if not os.path.exists(path):
            continue
        if _header(path) == LONG_FORM:
            groups = read_ncu_parts(path).values()
        else:
            groups = [{k: v for k, v in launch.items() if isinstance(v[0], float)}
                      for launch in read_ncu_launches(path)]
        for group in groups:
            for k, v in group.items():
                metrics.setdefault(k, v)
    return metrics
