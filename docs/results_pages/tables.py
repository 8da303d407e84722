"""Readers of bench/sdpa_compare.py's tables as data: a tables file (bench/records.py's format, its
docstring says it all) holds one run's tables, cell by cell, with what the run was in its meta.
sdpa_compare.py writes tables.json for every run; a record that predates it keeps its printed text
(which a record page may show as written) with the same tables in X.json beside it. The readers
take the tables they need by kind and their cells by column key, so a file with more kinds or more
columns reads the same."""

import os

import records  # bench/records.py: make_results.py puts bench/ on sys.path


def beside(name, ext=".json"):
    """The tables file beside a printed record: 'stage09_road09.txt' -> 'stage09_road09.json'."""
    return os.path.splitext(name)[0] + ext


def read_run(path):
    """The records.Run of a tables file; None when the file is not there (ValueError when it is
    there but not a tables file)."""
    if not os.path.exists(path):
        return None
    return records.read_tables(path)


def read_stage09_steps(path):
    """Stage 09's road in one run (stage09_steps_quick.json and the like): one dict per (step,
    dtype, d, N, causal) with the cells of its row, keyed as records.STAGE09_PAIR (the default main
    kernel's table, kind "default") or records.STAGE09_STEP (another step's, kind "step") keys them,
    "-" as None; with the run's GPU, date, problem size (B*N tokens, H*d width: None when the run
    does not say) and the step the default main kernel was in that run (meta default_steps["09"];
    None when the record does not say: its rows are then step None, "default"). A step's own table
    wins over the default's rows at that step. Any number of steps. None when the file is not there
    or holds no row."""
    run = read_run(path)
    if run is None:
        return None
    default_step = (run.meta.get("default_steps") or {}).get("09")
    rows = {}
    for table in run.tables:
        if table.kind == "stage09_pair":
            kind, step = "default", default_step
        elif table.kind == "stage09_step":
            kind, step = "step", int(table.meta["step"])
        else:
            continue
        for r in table.row_dicts():
            r.update(kind=kind, step=step, dtype=table.meta["dtype"], bad=bool(r.get("bad")))
            key = (step, r["dtype"], r["d"], r["N"], r["causal"])
            if kind == "step" or key not in rows:
                rows[key] = r
    if not rows:
        return None
    return {"gpu": run.meta.get("gpu", ""), "date": run.meta.get("date", ""), "default_step": default_step,
            "tokens": run.meta.get("tokens"), "width": run.meta.get("width"), "rows": list(rows.values())}


def read_stage09_pairs(paths):
    """The default main kernel's points in the stage09_pair tables of the runs `paths`:
    {(dtype, d, N, causal): row dict keyed as records.STAGE09_PAIR}, each point once (the first run
    that has it wins), with the sorted GPUs and dates of the runs that have such a table."""
    points, gpus, dates = {}, set(), set()
    for path in paths:
        run = read_run(path)
        pairs = run.of_kind("stage09_pair") if run else []
        if pairs:
            gpus.add(run.meta.get("gpu", ""))
            dates.add(run.meta.get("date", ""))
        for table in pairs:
            for r in table.row_dicts():
                points.setdefault((table.meta["dtype"], r["d"], r["N"], r["causal"]), r)
    return points, sorted(gpus), sorted(dates)


def read_ratios(path):
    """The ratios over rounds of one run (kind "ratios": sdpa_compare.py prints them in tables of
    at most six columns; their columns are merged here): {(dtype, d, N, causal): {"A/B/PASS":
    [median, min, max] or None}}, and the run's meta (gpu, date, rounds); ({}, {}) when the file is
    not there."""
    run = read_run(path)
    if run is None:
        return {}, {}
    grid = {}
    for table in run.of_kind("ratios"):
        for r in table.row_dicts():
            point = grid.setdefault((r["dtype"], r["d"], r["N"], r["causal"]), {})
            for key, cell in r.items():
                if key not in ("dtype", "d", "N", "causal"):
                    point.setdefault(key, cell)
    return grid, run.meta
