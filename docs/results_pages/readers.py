"""Readers of the records of docs/results/ that are not sdpa_compare.py's tables (tables.py reads
those): the sweeps' CSV and JSON, the roads, the CPU sweep, stage 10's ratios, the ceilings and
stage 11's first timings. Each returns None when its file is not there; a malformed line is
skipped and counted in `notes`, which the page shows as a warning."""

import csv
import json
import os

from .formatting import stage_step, truthy

GPU_COLUMNS = ["impl", "dtype", "B", "H", "N", "d", "causal", "median_ms", "tflops", "gpu", "sm_clock_mhz", "date"]
CPU_KEYS = ["stage", "title", "B", "H", "Nq", "Nk", "d", "causal", "median_ms", "gflops", "peak_rss_bytes",
            "rss_before_bytes", "intermediate_bytes", "pass", "machine", "date"]
ROAD_COLUMNS = ["kind", "impl", "step", "step_name", "dtype", "d", "N", "causal", "tflops", "gain"]
FIRST_CONTACT_FORMAT = "flashcourse-first-contact"


def csv_rows(path, columns, notes):
    """The rows of a CSV record as dicts; None, with a note, when its head lacks one of `columns`
    (the record is then not used)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            notes.append(f"`{os.path.basename(path)}` lacks the columns {', '.join(missing)}; it is not used.")
            return None
        return list(reader)


def note_malformed(path, bad, notes):
    """The warning for `bad` lines of a record that could not be read (none when there are none)."""
    if bad:
        notes.append(f"{bad} malformed line(s) of `{os.path.basename(path)}` were skipped.")


def read_gpu(path, notes, info, rename=None):
    """The rows of a sweep CSV (gpu_sweep.csv, stage11_sweep.csv: bench/sdpa_compare.py): impl,
    dtype, B, H, N, d, causal, median_ms, tflops, gpu, sm_clock_mhz, date, and where present pass
    (forward, backward or fwd+bwd; forward without the column), check, step and step_name. Rows of
    a road's steps (stage07_step3) are left out (road.csv holds those, with their gains), and so
    are rows without a time (counted in `info`). `rename` maps an impl to the name it is shown
    under (a step of a road that stands for another stage in the same run) before the steps are
    left out."""
    if not os.path.exists(path):
        return None
    raws = csv_rows(path, GPU_COLUMNS, notes)
    if raws is None:
        return []
    rows, bad, unmeasured = [], 0, 0
    for raw in raws:
        raw["impl"] = (rename or {}).get((raw.get("impl") or "").strip(), raw.get("impl"))
        if stage_step((raw.get("impl") or "").strip()):
            continue
        if not (raw.get("tflops") or "").strip() or not (raw.get("median_ms") or "").strip():
            unmeasured += 1  # a backend without a kernel for this dtype/shape, or skipped for memory
            continue
        try:
            rows.append({
                "impl": raw["impl"].strip(),
                "dtype": raw["dtype"].strip(),
                "B": int(raw["B"]), "H": int(raw["H"]), "N": int(raw["N"]), "d": int(raw["d"]),
                "causal": truthy(raw["causal"]),
                "median_ms": float(raw["median_ms"]),
                "tflops": float(raw["tflops"]),
                "gpu": raw["gpu"].strip(),
                "sm_clock_mhz": raw["sm_clock_mhz"].strip(),
                "date": raw["date"].strip(),
                "pass": (raw.get("pass") or "").strip() or "forward",
                "check": (raw.get("check") or "").strip(),
                "step": (raw.get("step") or "").strip(),
                "step_name": (raw.get("step_name") or "").strip(),
            })
        except (KeyError, ValueError, TypeError, AttributeError):
            bad += 1
    note_malformed(path, bad, notes)
    if unmeasured:
        info.append(f"{unmeasured} row(s) of `{os.path.basename(path)}` have no time: the sweep found no "
                    "kernel for that dtype and shape, or skipped it (SDPA's math backend where its N × N "
                    "matrices would not fit). They show as – in the tables.")
    return rows


def stage09_shown_step(path):
    """The renaming read_gpu() needs to show stage 09's rows: none when the sweep has rows of the
    default main kernel (impl stage09); else those of the lowest step it has (stage09_step<i> and
    its deterministic rows) under the default's names, since a sweep measured when that step was
    the default is all there is (the stage 09 section names the step)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            impls = {(r.get("impl") or "").strip() for r in csv.DictReader(f)}
    except OSError:
        return None
    if "stage09" in impls:
        return None
    steps = sorted(s[1] for s in map(stage_step, impls) if s and s[0] == "09")
    if not steps:
        return None
    shown = f"stage09_step{steps[0]}"
    return {shown: "stage09", shown + "_deterministic": "stage09_deterministic"}


def read_jsonl_by_name(path):
    """The lines of a JSON Lines record of rates (mma_ceiling.jsonl, wgmma_ceiling.jsonl: one
    object per instruction, with its name, value, unit, sm_clock_mhz, sm_count, per_sm_per_clock,
    gpu, date) keyed by their name; {} when the file is not there or not such a record."""
    lines = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    c = json.loads(line)
                    lines[c["name"]] = c
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return lines


def read_gpu_meta(csv_path):
    """The sweep's own record beside the CSV (gpu_sweep.json): PyTorch version, timing method, and
    the ceilings mma_ceiling measured (in the record, or in mma_ceiling.jsonl beside it)."""
    path = os.path.splitext(csv_path)[0] + ".json"
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        out = {k: str(meta[k]) for k in ("gpu", "torch", "max_sm_clock_mhz", "method") if meta.get(k) not in (None, "")}
        if isinstance(meta.get("ceilings"), dict):
            out["ceilings"] = {k: v for k, v in meta["ceilings"].items() if isinstance(v, dict) and "value" in v}
        if meta.get("wgmma_ceiling_tflops"):
            out["wgmma_ceiling_tflops"] = float(meta["wgmma_ceiling_tflops"])
        if meta.get("stage11_final_step") is not None:
            out["stage11_final_step"] = int(meta["stage11_final_step"])
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    results_dir = os.path.dirname(csv_path)
    if not out.get("wgmma_ceiling_tflops"):
        try:
            rates = read_jsonl_by_name(os.path.join(results_dir, "wgmma_ceiling.jsonl"))
            out["wgmma_ceiling_tflops"] = float(rates["wgmma_ss_bf16"]["value"])
        except (ValueError, TypeError, KeyError):
            pass
    if not out.get("ceilings"):
        rates = read_jsonl_by_name(os.path.join(results_dir, "mma_ceiling.jsonl"))
        if rates:
            out["ceilings"] = rates
    return out


def mma_ceiling(meta, dtype="bf16"):
    """The mma.sync rate of `dtype` (bf16 or fp16) in TFLOP/s; the bf16 one when fp16's is not
    recorded (the tensor cores run both at one rate); None when neither is."""
    for name in ("mma_" + dtype, "mma_bf16"):
        try:
            return float(meta["ceilings"][name]["value"])
        except (KeyError, TypeError, ValueError):
            pass
    return None


def read_road(path, notes):
    """road.csv or road11.csv of bench/sdpa_compare.py: one row per step of the road (kind road),
    tuning candidate (candidate) or SDPA backend (sdpa) and shape, with its TFLOP/s, its gain over
    the step before and, on stage 11's road, its ratio to SDPA cuDNN."""
    if not os.path.exists(path):
        return None
    raws = csv_rows(path, ROAD_COLUMNS, notes)
    if raws is None:
        return []
    rows, bad = [], 0
    for raw in raws:
        try:
            rows.append({
                "kind": raw["kind"].strip(), "impl": raw["impl"].strip(),
                "step": int(raw["step"]) if raw["step"].strip() else None,
                "step_name": raw["step_name"].strip(), "idea": (raw.get("idea") or "").strip(),
                "dtype": raw["dtype"].strip(), "d": int(raw["d"]), "N": int(raw["N"]),
                "causal": truthy(raw["causal"]), "tflops": float(raw["tflops"]),
                "gain": float(raw["gain"]) if raw["gain"].strip() else None,
                "vs_cudnn": float(raw["vs_cudnn"]) if (raw.get("vs_cudnn") or "").strip() else None,
                "gpu": (raw.get("gpu") or "").strip(), "sm_clock_mhz": (raw.get("sm_clock_mhz") or "").strip(),
                "date": (raw.get("date") or "").strip(),
            })
        except (KeyError, ValueError, TypeError, AttributeError):
            bad += 1
    note_malformed(path, bad, notes)
    return rows


def read_cpu(path, notes):
    """cpu_sweep.jsonl: one object per line, as the CPU stages print with --json; the memory a
    stage allocates itself (extra_bytes) is its peak resident set less what it held before."""
    if not os.path.exists(path):
        return None
    rows, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                missing = [k for k in CPU_KEYS if k not in r]
                if missing:
                    raise KeyError(missing)
                rows.append({
                    "stage": str(r["stage"]).zfill(2), "title": str(r["title"]),
                    "B": int(r["B"]), "H": int(r["H"]), "Nq": int(r["Nq"]), "Nk": int(r["Nk"]), "d": int(r["d"]),
                    "causal": truthy(r["causal"]), "layout": str(r.get("layout", "")),
                    "median_ms": float(r["median_ms"]), "gflops": float(r["gflops"]),
                    "extra_bytes": max(0.0, float(r["peak_rss_bytes"]) - float(r["rss_before_bytes"])),
                    "peak_rss_bytes": float(r["peak_rss_bytes"]),
                    "intermediate_bytes": float(r["intermediate_bytes"]),
                    "pass": truthy(r["pass"]), "machine": str(r["machine"]), "date": str(r["date"]),
                })
            except (ValueError, KeyError, TypeError):
                bad += 1
    note_malformed(path, bad, notes)
    return rows


def read_stage10(path, notes):
    """stage10.csv (bench/sdpa_compare.py --stages 10): one dict per row, sizes and rounds as ints,
    measures as floats or None where empty (an SDPA backend without a kernel for the case: the note
    says why). A memory row (kind memory: the padded batch's bytes over the packed one's) also has
    padded_bytes and packed_bytes, the two byte counts of its ratio (None on other rows, and where
    the record predates the columns). None when the file is not there."""
    if not os.path.exists(path):
        return None
    number = lambda text: float(text) if (text or "").strip() else None
    count = lambda text: int(text) if (text or "").strip() else None
    rows, bad = [], 0
    with open(path, newline="", encoding="utf-8") as f:
        for raw in csv.DictReader(f):
            try:
                row = {k: raw[k].strip() for k in ("kind", "variant", "ours", "other", "pass", "dtype", "gpu", "date")}
                row.update({k: int(raw[k]) for k in ("d", "N", "B", "H")})
                row["rounds"] = int(raw["rounds"] or 0)
                row.update({k: number(raw[k]) for k in ("value", "lo", "hi", "ours_ms", "other_ms", "ours_tflops",
                                                        "other_tflops")})
                row["note"] = (raw.get("note") or "").strip()
                row.update({k: count(raw.get(k)) for k in ("padded_bytes", "packed_bytes")})
                rows.append(row)
            except (KeyError, ValueError, TypeError, AttributeError):
                bad += 1
    note_malformed(path, bad, notes)
    return rows


def read_first_contact(path):
    """Stage 11's first timings (stage11_first_contact.json, beside the log it was taken from:
    `python3 bench/session.py run bringup11` writes both, bench/bringup11.py; the committed
    records of 2026-11-23 came from its bash forerunner, bench/hopper_first_contact.sh):

        {"format": "flashcourse-first-contact", "version": 1, "log": "<the log's file name>",
         "gpu": "NVIDIA H100 80GB HBM3",
         "ceilings": {"wgmma_ss_bf16": 915.6, ...},   # TFLOP/s of bench/wgmma_ceiling.cu in the log
         "runs": [{"step": 0, "step_name": "stage 07's final kernel", "dtype": "bf16", "d": 64,
                   "N": 4096, "causal": false, "median_ms": 0.2138, "tflops": 321.46,
                   "command": "<the stage11_hopper_kernel --bench command line>"}, ...]}

    (bringup11's runs also carry B, H, pass and date from the run's own --json record.) One run per `stage11_hopper_kernel --step S ... --bench` of the log. Returns {"gpu", "runs",
    "ceilings"}; None when the file is not there; ValueError when it is not such a record."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if record.get("format") != FIRST_CONTACT_FORMAT or record.get("version") != 1:
        raise ValueError(f"{path}: not a {FIRST_CONTACT_FORMAT} record of version 1")
    return {"gpu": record.get("gpu", ""), "runs": [dict(r) for r in record["runs"]],
            "ceilings": dict(record.get("ceilings", {}))}


def read_first_contacts(results_dir):
    """Stage 11's first timings: stage11_first_contact.json, with the runs of the second record
    (stage11_first_contact_road.json: steps 4 to 8 added, the same shapes timed again) in place of
    the first's at the same step and shape; None when neither is there."""
    first = read_first_contact(os.path.join(results_dir, "stage11_first_contact.json"))
    later = read_first_contact(os.path.join(results_dir, "stage11_first_contact_road.json"))
    if not later:
        return first
    if first is None:
        return later
    key = lambda r: (r["step"], r["d"], r["N"], r["causal"])
    newer = {key(r) for r in later["runs"]}
    first["runs"] = [r for r in first["runs"] if key(r) not in newer] + later["runs"]
    first["ceilings"].update(later["ceilings"])
    first["gpu"] = later["gpu"] or first["gpu"]
    return first
