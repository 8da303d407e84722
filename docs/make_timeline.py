#!/usr/bin/env python3
"""Draws the measured timeline of one thread block of stage 11 as SVG (no third-party modules).

Input: the JSON files `stage11_hopper_kernel --bench --timeline FILE` writes (one per step; the
marks of the instrumented build, stages/11_hopper_kernel/timeline.hpp). A mark says what has
just ended; the span from a warpgroup's previous mark to it is that activity, coloured by kind:

  waiting for data      q_landed, slot_full (consumers), slot_empty, q_empty (producer), item
                        (the persistent grid: the next work item taken from the counter, or posted)
  waiting for its turn  turn (ping-pong's named barrier)
  issuing GEMMs         issued (wgmma instructions going out, and the turn passed on)
  tensor cores busy     s_ready, pv_done (the warpgroup waits for its own wgmma)
  softmax               softmax
  rescale O, pack P     rescaled
  epilogue              epilogue (O and LSE written)
  issuing copies        q_issued, load_issued (the producer's TMA instructions)

Outputs: one SVG with a panel per file (the first `--tiles` key tiles of the block, on one time
axis so that the panels compare), and with --table a text table of where each warpgroup's time
went over the whole block. Time is counted in the SM's cycles (clock64), as the kernel read it:
the block's own %globaltimer readings, also in the files, disagreed with the kernel's measured
time by up to a quarter on long runs, so no conversion to microseconds is drawn.

Usage: make_timeline.py --out stage11_timeline.svg [--table stage11_timeline_table.txt] [--tiles 6 | --window 80000]
                        timeline_step3.json timeline_step4.json ...
"""

import argparse
import json
import sys
from collections import OrderedDict

# Kind of each code's span: (label, fill colour). The order is the legend's.
KINDS = OrderedDict([
    ("wait", ("waiting for data or a free slot", "#c8c8c8")),
    ("turn", ("waiting for its turn", "#d9c8ee")),
    ("issue", ("issuing GEMMs (wgmma)", "#1f4e9c")),
    ("tensor", ("waiting for its GEMMs", "#8fb8e8")),
    ("softmax", ("softmax", "#f08a24")),
    ("rescale", ("rescale O, pack P", "#f5d04c")),
    ("epilogue", ("epilogue (O, LSE out)", "#3f9e4d")),
    ("copy", ("issuing TMA copies", "#555555")),
])
CODE_KIND = {
    "q_landed": "wait", "slot_full": "wait", "slot_empty": "wait", "q_empty": "wait", "item": "wait",
    "turn": "turn", "issued": "issue", "s_ready": "tensor", "pv_done": "tensor",
    "softmax": "softmax", "rescaled": "rescale", "epilogue": "epilogue",
    "q_issued": "copy", "load_issued": "copy",
}


def spans(record, group):
    """(start_cycle, end_cycle, kind, code, tile) of one warpgroup's spans."""
    codes = record["codes"]
    marks = record["warpgroups"][group]["marks"]
    out = []
    for (c0, _, _), (c1, what, tile) in zip(marks, marks[1:]):
        kind = CODE_KIND.get(codes[what])
        if kind is not None:
            out.append((c0, c1, kind, codes[what], tile))
    return out


def window_end(record, tiles):
    """The cycle at which the first consumer has finished key tile `tiles - 1` (or the block's end)."""
    codes = record["codes"]
    marks = record["warpgroups"][1]["marks"]
    last = max(m[0] for g in record["warpgroups"] for m in g["marks"])
    for cycle, what, tile in marks:
        if codes[what] == "rescaled" and tile >= tiles - 1 and record["ping_pong"]:
            return cycle
        if codes[what] == "pv_done" and tile >= tiles - 1 and not record["ping_pong"]:
            return cycle
    return last


def title_of(r):
    mask = "causal" if r["causal"] else "non-causal"
    if r.get("persistent"):
        items = sum(1 for m in r["warpgroups"][1]["marks"] if r["codes"][m[1]] == "item")
        work = f"{items} work items of Br {r['br']} rows, key tiles of {r['bc']}"
    else:
        work = f"{r['key_tiles']} key tiles of {r['bc']}, Br {r['br']}"
    return f"step {r['step']} ({r['step_name']}): d {r['d']}, N {r['Nq']}, {mask}; block {r['block']} of {r['blocks']}, {work}"


def tile_period(r):
    """The median number of cycles between consumer 0's consecutive slot_full marks of one item."""
    codes = r["codes"]
    marks = r["warpgroups"][1]["marks"]
    full = [(c, t) for c, w, t in marks if codes[w] == "slot_full"]
    periods = sorted(b[0] - a[0] for a, b in zip(full, full[1:]) if b[1] == a[1] + 1)
    return periods[len(periods) // 2] if periods else 0


def draw(records, tiles, out_path, window=None):
    width, left, right = 960, 120, 20
    row_h, gap, title_h, axis_h = 16, 4, 22, 26
    # One time axis for every panel (thousands of cycles): the longest window.
    windows = [window_end(r, tiles) / 1000.0 for r in records]
    span = window / 1000.0 if window else max(windows) if windows else 1.0
    scale = (width - left - right) / span
    parts, y = [], 10
    for r in records:
        parts.append(f'<text x="{left}" y="{y + 14}" font-size="13" font-weight="bold">{esc(title_of(r))}</text>')
        y += title_h
        for g, wg in enumerate(r["warpgroups"]):
            parts.append(f'<text x="{left - 8}" y="{y + 12}" font-size="12" text-anchor="end">{esc(wg["role"])}</text>')
            parts.append(f'<rect x="{left}" y="{y}" width="{width - left - right}" height="{row_h}" fill="#f7f7f7"/>')
            for c0, c1, kind, code, tile in spans(r, g):
                x0, x1 = c0 / 1000.0, c1 / 1000.0
                if x0 >= span:
                    continue
                x1 = min(x1, span)
                w = max((x1 - x0) * scale, 0.4)
                label, fill = KINDS[kind]
                parts.append(f'<rect x="{left + x0 * scale:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" fill="{fill}">'
                             f'<title>{esc(code)} of tile {tile}: {c1 - c0} cycles</title></rect>')
            y += row_h + gap
        y += 6
    # Axis.
    step_k = nice_step(span / 8)
    parts.append(f'<line x1="{left}" y1="{y}" x2="{width - right}" y2="{y}" stroke="#333"/>')
    t = 0.0
    while t <= span + 1e-9:
        x = left + t * scale
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#333"/>')
        parts.append(f'<text x="{x:.1f}" y="{y + 16}" font-size="11" text-anchor="middle">{t:g}</text>')
        t += step_k
    parts.append(f'<text x="{width - right}" y="{y + 28}" font-size="11" text-anchor="end">thousands of SM cycles from the '
                 f'block\'s first mark</text>')
    y += axis_h + 12
    # Legend.
    x = left
    for label, fill in KINDS.values():
        parts.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{fill}"/>')
        parts.append(f'<text x="{x + 16}" y="{y + 10}" font-size="11">{esc(label)}</text>')
        x += 16 + 6.2 * len(label) + 18
        if x > width - 160:
            x, y = left, y + 18
    y += 24
    if records:
        r = records[0]
        parts.append(f'<text x="{left}" y="{y}" font-size="11" fill="#555">Measured on {esc(r["gpu"])}, {esc(r["date"])}, '
                     f'bf16, B {r["B"]}, H {r["H"]}: one thread per warpgroup writes clock64 at each mark '
                     f'(stages/11_hopper_kernel/timeline.hpp).</text>')
        y += 10
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" viewBox="0 0 {width} {y + 10}" '
           f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(parts) + "\n</svg>\n")
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(svg)


def placeholder(out_path, why):
    with open(out_path, "w", encoding="utf-8") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg" width="640" height="40" font-family="sans-serif">'
                f'<text x="10" y="24" font-size="13">{esc(why)}</text></svg>\n')


def table(records, path):
    """Where each warpgroup's time went over the whole block, in % of the block's span."""
    kinds = list(KINDS)
    lines = ["Stage 11: where one thread block's time goes, per warpgroup, in % of the block's cycles",
             "(docs/make_timeline.py from the instrumented build's marks; the rest is the time before a",
             "warpgroup's first mark and after its last); tile: the median cycles from one K/V tile's",
             "slot_full to the next, consumer 0", ""]
    header = (f"{'step':>4} {'d':>3} {'N':>6} {'mask':<6} {'warpgroup':<10} {'kcycles':>8} {'tile':>6} "
              + " ".join(f"{k:>8}" for k in kinds))
    lines.append(header)
    lines.append("-" * len(header))
    for r in records:
        total = max(m[0] for g in r["warpgroups"] for m in g["marks"])
        tile = tile_period(r)
        for g, wg in enumerate(r["warpgroups"]):
            share = dict.fromkeys(kinds, 0.0)
            for c0, c1, kind, _, _ in spans(r, g):
                share[kind] += c1 - c0
            cells = " ".join(f"{100.0 * share[k] / total:8.1f}" for k in kinds)
            mask = "causal" if r["causal"] else "full"
            lines.append(f"{r['step']:>4} {r['d']:>3} {r['Nq']:>6} {mask:<6} {wg['role']:<10} {total / 1000.0:8.1f} "
                         f"{tile if g == 1 else '':>6} {cells}")
        lines.append(f"{'':>4} kernel {r['median_ms']:.4f} ms plain, {r['median_ms_instrumented']:.4f} ms instrumented "
                     f"({100.0 * (r['median_ms_instrumented'] / r['median_ms'] - 1.0):+.1f} %); B {r['B']}, H {r['H']}; "
                     f"{r['gpu']}, {r['date']}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def nice_step(x):
    for m in (1, 2, 5):
        for e in range(-3, 4):
            if m * 10 ** e >= x:
                return m * 10 ** e
    return x


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the SVG to write")
    ap.add_argument("--table", help="also write the table of shares here")
    ap.add_argument("--tiles", type=int, default=6, help="key tiles shown per panel (default 6)")
    ap.add_argument("--window", type=float, help="show this many cycles of each block instead")
    ap.add_argument("inputs", nargs="*", help="timeline JSON files, one panel each, in this order")
    args = ap.parse_args()
    records = []
    for path in args.inputs:
        try:
            with open(path, encoding="utf-8") as f:
                records.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"make_timeline.py: {path}: {e}", file=sys.stderr)
            return 2
    if not records:
        placeholder(args.out, "No timeline measured yet: python3 bench/session.py run timeline11 records one.")
        if args.table:
            with open(args.table, "w", encoding="utf-8") as f:
                f.write("No timeline measured yet: python3 bench/session.py run timeline11 records one.\n")
        return 0
    draw(records, args.tiles, args.out, args.window)
    if args.table:
        table(records, args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
