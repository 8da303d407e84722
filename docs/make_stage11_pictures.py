#!/usr/bin/env python3
"""Draws stage 11's three pictures of shared memory and its barriers as SVG (no third-party modules).

  stage11_smem_map.svg         each step's dynamic shared memory: Q, the K/V ring's slots (K and V on
                               rings of their own from step 15 at d = 128), O's buffer, the mbarriers
                               and the persistent grid's mailbox, with byte offsets and sizes. Read
                               from docs/results/stage11_smem_map.json, which the kernel's own layout
                               constants write (stages/11_hopper_kernel/smem_map.cu; the test
                               test_stage11_smem_map holds the file to the code), so it cannot drift.
  stage11_ring_parity.svg      the full/empty ring of S slots across rounds: which phase parity the
                               producer waits for on "empty" and the consumers on "full" (kernel.cuh:
                               Shape::round_parity(), run_persistent()); S is the default step's
                               ring at d = 64, read from the same JSON.
  stage11_persistent_flow.svg  the persistent grid (steps 9 and 12): the work counter, the producer
                               claiming an item and posting it in the mailbox, the consumers reading
                               it, and the barriers that order this (kernel.cuh: run_persistent()).

Usage: make_stage11_pictures.py --map docs/results/stage11_smem_map.json --images OUT_DIR
"""

import argparse
import json
import os

FONT = "Helvetica, Arial, sans-serif"
INK, MUTED, RULE = "#222", "#57606a", "#d0d7de"
# (fill, stroke) per kind of region; the palette of docs/images/*.svg.
COLOURS = {
    "Q": ("#dbe8f7", "#2f6fb3"),
    "K": ("#dcf2e0", "#1a7f37"),
    "V": ("#fde6d2", "#c4610a"),
    "O": ("#eee4fb", "#8250df"),
    "barrier": ("#ffe1e1", "#cf222e"),
    "mailbox": ("#fff4cc", "#9a6700"),
    "unused": ("#f6f8fa", "#8c959f"),
}


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    """A page of SVG elements on white (the docs' CSS inverts figures in dark mode)."""

    def __init__(self, width, height):
        self.width, self.height, self.items = width, height, []

    def rect(self, x, y, w, h, fill, stroke, sw=1.0, rx=2, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" fill="{fill}" '
                          f'stroke="{stroke}" stroke-width="{sw}"{d}/>')

    def text(self, x, y, s, size=11, anchor="start", fill=INK, bold=False, italic=False, mono=False):
        extra = (' font-weight="bold"' if bold else "") + (' font-style="italic"' if italic else "")
        extra += ' font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" xml:space="preserve"' if mono else ""
        self.items.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}"{extra}>'
                          f'{esc(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke=MUTED, sw=1.0, dash=None, arrow=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        a = f' marker-end="url(#arrow-{arrow.lstrip("#")})"' if arrow else ""
        self.items.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
                          f'stroke-width="{sw}"{d}{a}/>')

    def write(self, path):
        colours = sorted({c for c in ("#444", "#1a7f37", "#c4610a", "#2f6fb3", "#8250df", "#cf222e", "#9a6700", MUTED)})
        markers = "".join(
            f'<marker id="arrow-{c.lstrip("#")}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>' for c in colours)
        with open(path, "w", encoding="utf-8") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                    f'viewBox="0 0 {self.width} {self.height}" font-family="{FONT}">\n')
            f.write(f"<defs>{markers}</defs>\n")
            f.write(f'<rect x="0" y="0" width="{self.width}" height="{self.height}" fill="#ffffff"/>\n')
            f.write("\n".join(self.items))
            f.write("\n</svg>\n")


def kib(n):
    """Bytes as KiB, whole where whole."""
    return f"{n // 1024}" if n % 1024 == 0 else f"{n / 1024:.1f}"


def steps_text(steps):
    """[4, 5, 6, 7] -> 'steps 4-7'; [9, 10, 11, 13] -> 'steps 9-11, 13'."""
    runs, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            runs.append(str(start) if start == s else f"{start}\u2013{s}")
            start = None
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(runs)


def layout_key(m):
    return (m["head_dim"], m["small_blocks"], m["smem_bytes"], tuple((r["name"], r["offset"], r["bytes"]) for r in m["regions"]))


def groups_of(maps):
    """The maps with the same layout, in road order: [(first map, [steps])]."""
    out = {}
    for m in maps:
        out.setdefault(layout_key(m), (m, []))[1].append(m["step"])
    return list(out.values())


def region_colour(r):
    if r["kind"] == "tile":
        return COLOURS[r["name"][0]]
    return COLOURS[r["kind"]] if r["used"] else COLOURS["unused"]


def short_name(name):
    """'K slot 0' -> 'K0'; 'Q', 'O' stay."""
    parts = name.split()
    return parts[0] + parts[2] if len(parts) == 3 and parts[1] == "slot" else name


# ---------------------------------------------------------------------------------------- (a)
def draw_smem_map(maps, path):
    default = max(m["step"] for m in maps)
    blocks = [("d = 64", [m for m in maps if m["head_dim"] == 64 and not m["small_blocks"]]),
              ("d = 64, short causal heads (small blocks, three per SM)", [m for m in maps if m["small_blocks"]]),
              ("d = 128", [m for m in maps if m["head_dim"] == 128 and not m["small_blocks"]])]
    x0, bar_w, row_h, bar_h = 200, 690, 44, 22
    scale_bytes = 227 * 1024  # the most shared memory one block may have on Hopper
    px = bar_w / scale_bytes
    # Word by word: a producer's ring (step 3), and the default step's barriers at both head dimensions.
    plain = {(m["step"], m["head_dim"]): m for m in maps if not m["small_blocks"]}
    zoom = [plain[(3, 128)], plain[(default, 128)], plain[(default, 64)]]
    svg = Svg(1000, 0)  # the height is known at the end
    svg.text(20, 26, "Stage 11's shared memory, step by step: what each kernel instance keeps where", 13, bold=True)
    svg.text(20, 45, "Drawn from the kernel's own layout constants (kernel.cuh's Shape, through smem_map.cu). Offsets in "
                     "KiB from the block's aligned base; a whole bar is 227 KiB,", 11.5, fill=MUTED)
    svg.text(20, 61, "the most one block may have on Hopper. Right: the bytes the launch asks for, 1 KiB more than the "
                     "regions, to align the base (swizzled tiles start on 1024 bytes).", 11.5, fill=MUTED)
    # Legend.
    lx = 20
    for label, key in (("Q tile", "Q"), ("K slot", "K"), ("V slot", "V"), ("O buffer", "O"), ("mbarriers", "barrier"),
                       ("mailbox", "mailbox"), ("allocated, unused", "unused")):
        fill, stroke = COLOURS[key]
        svg.rect(lx, 70, 14, 11, fill, stroke, 1.0)
        svg.text(lx + 19, 80, label, 11)
        lx += 28 + 6.5 * len(label) + 10
    y = 100
    for title, ms in blocks:
        svg.text(20, y + 12, title, 12.5, bold=True)
        y += 22
        for m, steps in groups_of(ms):
            label = steps_text(steps)
            if m["step"] != m["kernel_step"] and len(steps) == 1:
                label += f" (step {m['kernel_step']}'s kernel)"
            svg.text(x0 - 10, y + 15, label, 12, anchor="end", bold=True)
            svg.text(x0 - 10, y + 29, f"Br {m['br']}, Bc {m['bc']}, {m['stages']}-slot ring" +
                     ("s" if m["split_ring"] else ""), 10, anchor="end", fill=MUTED)
            svg.rect(x0, y, bar_w, bar_h, "#ffffff", RULE, 0.8, rx=0)
            tiles = [r for r in m["regions"] if r["kind"] == "tile"]
            for r in tiles:
                fill, stroke = region_colour(r)
                rx, rw = x0 + r["offset"] * px, r["bytes"] * px
                svg.rect(rx, y, rw, bar_h, fill, stroke, 0.9, rx=0)
                name = short_name(r["name"])
                if r["name"] == "Q" and m["o_in_q"]:
                    name = "Q, then O"
                if rw > 6.5 * len(name) + 4:
                    svg.text(rx + rw / 2, y + 15, name, 10.5, anchor="middle", fill=stroke, bold=True)
                svg.text(rx + 1, y + bar_h + 10, kib(r["offset"]), 8.5, fill=MUTED)
            bars = [r for r in m["regions"] if r["kind"] != "tile"]
            b0, b1 = bars[0]["offset"], bars[-1]["offset"] + bars[-1]["bytes"]
            used = any(r["used"] for g in ms if g["step"] in steps for r in g["regions"] if r["kind"] != "tile")
            fill, stroke = COLOURS["barrier"] if used else COLOURS["unused"]
            bx = x0 + b0 * px  # a few hundred bytes: drawn 5 pixels wide
            svg.rect(bx, y - 3, 5, bar_h + 6, fill, stroke, 1.0, rx=0)
            svg.text(bx + 1, y + bar_h + 10, kib(b0), 8.5, fill=stroke)
            svg.text(x0 + bar_w + 8, y + 11, f"{m['smem_bytes']:,} B", 10.5, fill=INK)
            svg.text(x0 + bar_w + 8, y + 24, f"{b1 - b0} B of barriers", 9, fill=MUTED)
            y += row_h
        y += 8
    # The barrier areas, word by word.
    y += 6
    svg.text(20, y, "The barrier area, 8 bytes a word (byte offsets from the aligned base); a full and an empty "
                    "barrier per slot, then the persistent grid's", 12, bold=True)
    svg.text(20, y + 16, "Q empty, its mailbox's item-full and item-empty pairs and the mailbox's two entries (step 12: "
                         "an item decoded, six ints each).", 12, bold=True)
    y += 34
    for m in zoom:
        bars = [r for r in m["regions"] if r["kind"] != "tile"]
        b0 = bars[0]["offset"]
        words = (bars[-1]["offset"] + bars[-1]["bytes"] - b0) / 8
        ww = min(46.0, (1000 - 40) / words)
        svg.text(20, y + 12, f"d = {m['head_dim']}, {steps_text([m['step']])}" +
                 (" (the default)" if m["step"] == default else "") + f": barriers from byte {b0:,}", 11.5, bold=True)
        for r in bars:
            fill, stroke = region_colour(r)
            rx = 20 + (r["offset"] - b0) / 8 * ww
            rw = r["bytes"] / 8 * ww
            svg.rect(rx, y + 20, rw - 1, 34, fill, stroke, 0.9, rx=1)
            top, bottom = barrier_label(r["name"])
            svg.text(rx + rw / 2, y + 34, top, 9, anchor="middle", fill=stroke, bold=True)
            svg.text(rx + rw / 2, y + 46, bottom, 9, anchor="middle", fill=stroke)
            svg.text(rx + rw / 2, y + 66, f"+{r['offset'] - b0}", 8.5, anchor="middle", fill=MUTED)
        y += 92
    svg.text(20, y - 8, "Step 1 copies with cp.async and allocates barriers it never uses; step 2 uses Q's and the full "
                        "ones (one thread loads); from step 3 the producer waits on the empty ones.", 10.5, fill=MUTED)
    svg.height = y + 4
    svg.write(path)


def barrier_label(name):
    """Two short lines for a barrier word: ('K/V 0', 'full')."""
    p = name.split()
    if p[0] == "mailbox":
        return "mailbox", "entry " + p[2]
    if p[0] == "item":
        return "item " + p[2], p[1]
    if p[0] == "Q":
        return "Q", p[1]
    return f"{p[0]} {p[2]}", p[1]


# ---------------------------------------------------------------------------------------- (b)
def draw_ring_parity(maps, path):
    default = max(m["step"] for m in maps)
    ring = next(m for m in maps if m["step"] == default and m["head_dim"] == 64 and not m["small_blocks"])
    stages, rounds = ring["stages"], 3
    tiles = stages * rounds
    x0, cw = 330, 70
    width = x0 + tiles * cw + 20
    svg = Svg(width, 560)
    svg.text(20, 26, f"The full/empty ring of S = {stages} slots (the default step at d = 64): which phase each wait "
                     "asks for, round by round", 13, bold=True)
    svg.text(20, 45, "K/V tile k (counted from the block's first tile, across its work items) goes to slot s = k mod S "
                     "in round r = \u230ak / S\u230b. Each slot has a full", 11.5, fill=MUTED)
    svg.text(20, 61, "and an empty mbarrier; each completes one phase per round, and its parity bit flips. A wait names "
                     "the parity of the phase it waits for to complete.", 11.5, fill=MUTED)
    rows = [
        ("ring tile k", lambda k: str(k), None),
        ("slot s = k mod S", lambda k: str(k % stages), "slot"),
        ("round r = \u230ak / S\u230b", lambda k: str(k // stages), None),
        ("producer waits on empty[s]", lambda k: "no wait" if k < stages else f"parity {(k // stages - 1) & 1}", "empty"),
        ("for its phase r \u2212 1, parity (r \u2212 1) & 1", lambda k: "(empty)" if k < stages else f"phase {k // stages - 1}",
         "sub"),
        ("full[s] completes (the TMA's bytes landed)", lambda k: f"phase {k // stages}", "full_done"),
        ("consumers wait on full[s]", lambda k: f"parity {(k // stages) & 1}", "full"),
        ("for its phase r, parity round_parity(k) = r & 1", lambda k: f"phase {k // stages}", "sub"),
        ("empty[s] completes (128 \u00d7 C arrivals)", lambda k: f"phase {k // stages}", "empty_done"),
    ]
    slot_fill = ["#dbe8f7", "#dcf2e0", "#fde6d2", "#eee4fb"]
    slot_stroke = ["#2f6fb3", "#1a7f37", "#c4610a", "#8250df"]
    y = 84
    for r in range(rounds):
        svg.rect(x0 + r * stages * cw + 2, y - 4, stages * cw - 4, 9 * 30 + 10, "#fafbfc" if r % 2 else "#ffffff", RULE, 0.8,
                 rx=4)
        svg.text(x0 + (r + 0.5) * stages * cw, y + 6 + 9 * 30 + 18, f"round {r}", 11.5, anchor="middle", fill=MUTED, bold=True)
    for i, (label, value, kind) in enumerate(rows):
        ry = y + i * 30
        svg.text(x0 - 10, ry + 17, label, 11.5 if kind != "sub" else 10.5, anchor="end",
                 fill=INK if kind != "sub" else MUTED, bold=kind not in ("sub",))
        for k in range(tiles):
            cx = x0 + k * cw
            s = k % stages
            text = value(k)
            if kind == "slot":
                svg.rect(cx + 8, ry + 3, cw - 16, 22, slot_fill[s % 4], slot_stroke[s % 4], 1.0)
                svg.text(cx + cw / 2, ry + 18, text, 11.5, anchor="middle", fill=slot_stroke[s % 4], bold=True)
            elif kind in ("empty", "full"):
                colour = "#c4610a" if kind == "empty" else "#1a7f37"
                if text == "no wait":
                    svg.text(cx + cw / 2, ry + 18, text, 10.5, anchor="middle", fill=MUTED, italic=True)
                else:
                    svg.rect(cx + 6, ry + 3, cw - 12, 22, "#ffffff", colour, 1.2)
                    svg.text(cx + cw / 2, ry + 18, text, 11, anchor="middle", fill=colour, bold=True)
            elif kind in ("full_done", "empty_done"):
                svg.text(cx + cw / 2, ry + 18, text, 10.5, anchor="middle", fill="#1a7f37" if kind == "full_done" else "#c4610a")
            else:
                svg.text(cx + cw / 2, ry + 18, text, 10.5 if kind == "sub" else 11.5, anchor="middle",
                         fill=MUTED if kind == "sub" else INK, italic=kind == "sub")
    y += 9 * 30 + 46
    notes = [
        ("The code (kernel.cuh: run_persistent(), step 3's producer loop; mbarrier.cuh)", "head"),
        ("consumer, before reading tile k:  mbarrier_wait_parity(full[k % S], (k / S) & 1);   // Shape::round_parity(k)", "mono"),
        ("                after its last read:  mbarrier_arrive(empty[k % S]);", "mono"),
        ("producer, before loading tile k:  if (k >= S) mbarrier_wait_parity(empty[k % S], (k / S - 1) & 1);", "mono"),
        ("                                  mbarrier_arrive_expect_tx(full[k % S], bytes);  then the TMA copies", "mono"),
        ("Why one bit is enough: the producer refills a slot only after the consumers' phase of the round before has "
         "completed, so it is never more", "text"),
        ("than one round ahead of them on a slot, and \"the phase with parity p\" names one phase. Round 0 does not "
         "wait: the slots start empty (a wait", "text"),
        ("for parity 1 on a fresh barrier passes at once, the other common way to start; this code skips the wait "
         "instead).", "text"),
        ("The same convention everywhere in the kernel", "head"),
        ("Q's buffer is a ring of one slot counted in items with keys (Q full: rounds & 1; Q empty: (rounds \u2212 1) & 1); "
         "the mailbox is a ring of two", "text"),
        ("entries (item full[r & 1]: (r / 2) & 1; item empty: (r / 2 \u2212 1) & 1). Step 15 at d = 128: K and V on rings "
         "of their own, each slot with its own barriers.", "text"),
    ]
    for text, kind in notes:
        if kind == "head":
            y += 6
        svg.text(20, y, text, 10.5 if kind == "mono" else 11.5 if kind == "head" else 10.8,
                 fill=INK if kind == "head" else "#333", bold=kind == "head", mono=kind == "mono")
        y += 18
    svg.height = y + 6
    svg.write(path)


# ---------------------------------------------------------------------------------------- (c)
def draw_persistent_flow(maps, path):
    width = 1000
    entry = {m["step"]: next(r["bytes"] for r in m["regions"] if r["name"] == "mailbox entry 0")
             for m in maps if m["persistent"] and m["head_dim"] == 128}
    lanes = [(110, "work counter", "global memory, zeroed", "before each launch"),
             (330, "producer thread", "warpgroup 0, thread 0", "(24 registers)"),
             (600, "mailbox", "shared memory: 2 entries", "+ item full / empty"),
             (860, "consumer warpgroups", "1 .. C, 128 threads each", "(240 or 160 registers)")]
    svg = Svg(width, 820)
    svg.text(20, 26, "The persistent grid (step 9; step 12's claim ahead): one block per SM, work items handed out "
                     "through a counter and a mailbox", 13, bold=True)
    svg.text(20, 45, "Round r of the block (its r-th item) uses mailbox entry e = r & 1; the entries and their barriers "
                     "are a ring of two slots, with the parities of the ring.", 11.5, fill=MUTED)
    top, bottom = 66, 700
    for x, name, sub1, sub2 in lanes:
        svg.rect(x - 95, top, 190, 52, "#f6f8fa", "#8c959f", 1.0, rx=4)
        svg.text(x, top + 18, name, 12.5, anchor="middle", bold=True)
        svg.text(x, top + 33, sub1, 10.5, anchor="middle", fill=MUTED)
        svg.text(x, top + 46, sub2, 10.5, anchor="middle", fill=MUTED)
        svg.line(x, top + 52, x, bottom, stroke="#c8cdd3", sw=1.2, dash="4,4")
    cx, px, mx, wx = (lane[0] for lane in lanes)

    def note(x, y, lines, colour=INK, anchor="start", size=10.8):
        for i, t in enumerate(lines):
            svg.text(x, y + i * 14, t, size, anchor=anchor, fill=colour if i == 0 else MUTED, bold=i == 0)

    def act(x, y, w, h, lines, fill, stroke):
        svg.rect(x - w / 2, y, w, h, fill, stroke, 1.1, rx=3)
        for i, t in enumerate(lines):
            svg.text(x, y + 15 + i * 13, t, 10.5 if i else 11, anchor="middle", fill=stroke if i == 0 else INK, bold=i == 0)

    y = 140
    # 1. claim
    svg.line(px - 4, y + 8, cx + 4, y + 8, stroke="#2f6fb3", sw=1.4, arrow="#2f6fb3")
    note(cx + 12, y + 2, ["atomicAdd(counter, 1)"], "#2f6fb3")
    svg.line(cx + 4, y + 24, px - 4, y + 24, stroke="#2f6fb3", sw=1.4, arrow="#2f6fb3")
    note(cx + 12, y + 38, ["item number w"], "#2f6fb3")
    note(px + 16, y + 4, ["\u2460 claim the next item", "step 9: when it needs it (a round trip of",
                          "about a microsecond); step 12: already claimed,", "while the last K/V tile of the item before",
                          "waited for its slot: the answer is ready"], "#2f6fb3")
    y += 96
    # 2. entry free
    svg.line(mx - 4, y + 10, px + 4, y + 10, stroke="#c4610a", sw=1.4, arrow="#c4610a")
    act(mx, y - 6, 190, 34, ["item empty[e]", "r \u2265 2: wait parity ((r / 2) \u2212 1) & 1"], "#fde6d2", "#c4610a")
    note(px - 100, y + 36, ["\u2461 wait until entry e is free", "every consumer thread has read round r \u2212 2's",
                            "entry (128 \u00d7 C arrivals complete the phase)"], "#c4610a")
    y += 92
    # 3. post
    svg.line(px + 4, y + 10, mx - 114, y + 10, stroke="#9a6700", sw=1.4, arrow="#9a6700")
    act(mx, y - 14, 220, 60, ["entry e", f"step 9: the number w ({entry[9]} bytes)",
                              f"step 12: the item decoded ({entry[12]} bytes):", "b, h, q0, full, end, and a pad"],
        "#fff4cc", "#9a6700")
    note(px - 100, y + 36, ["\u2462 post the item", "step 12 decodes it once (block_work, key_tiles)",
                            "for every consumer; end = \u22121: no item left"], "#9a6700")
    y += 92
    # 4. arrive item full
    svg.line(px + 4, y + 10, mx - 100, y + 10, stroke="#1a7f37", sw=1.4, arrow="#1a7f37")
    act(mx, y - 6, 190, 34, ["item full[e]", "1 arrival: the producer's (release)"], "#dcf2e0", "#1a7f37")
    note(px - 100, y + 36, ["\u2463 arrive on item full[e]", "release: whoever sees the phase complete",
                            "sees the entry's words"], "#1a7f37")
    # 5. consumers wait item full
    svg.line(mx + 100, y + 10, wx - 4, y + 10, stroke="#1a7f37", sw=1.4, arrow="#1a7f37")
    note(wx - 86, y + 36, ["\u2464 wait item full[e]", "parity (r / 2) & 1 (acquire), read", "entry e (step 9: decode w",
                           "itself: block_work's divisions)"], "#1a7f37")
    y += 92
    # 6. consumers arrive item empty
    svg.line(wx - 4, y + 10, mx + 100, y + 10, stroke="#c4610a", sw=1.4, arrow="#c4610a")
    act(mx, y - 6, 190, 34, ["item empty[e]", "128 \u00d7 C arrivals"], "#fde6d2", "#c4610a")
    note(wx - 86, y + 36, ["\u2465 arrive on item empty[e]", "each thread, once it has the item;",
                           "no item left: leave the loop"], "#c4610a")
    y += 92
    # 7. loads and compute
    svg.rect(px - 95, y - 8, 190, 74, "#dbe8f7", "#2f6fb3", 1.1, rx=3)
    for i, t in enumerate(["\u2466 load the item", "wait Q empty, (rounds \u2212 1) & 1", "(not before the first)",
                           "TMA Q \u2192 Q full; K/V tiles", "into the ring as slots free"]):
        svg.text(px, y + 7 + i * 14, t, 11 if i == 0 else 10.5, anchor="middle", fill="#2f6fb3" if i == 0 else INK, bold=i == 0)
    svg.rect(wx - 95, y - 8, 190, 74, "#dbe8f7", "#2f6fb3", 1.1, rx=3)
    for i, t in enumerate(["\u2467 compute the item", "wait Q full: rounds & 1", "turns over its K/V tiles;",
                           "after its last S = Q K\u1d40:", "arrive Q empty; then O out"]):
        svg.text(wx, y + 7 + i * 14, t, 11 if i == 0 else 10.5, anchor="middle", fill="#2f6fb3" if i == 0 else INK, bold=i == 0)
    svg.line(px + 96, y + 28, wx - 96, y + 28, stroke="#2f6fb3", sw=1.2, dash="5,3", arrow="#2f6fb3")
    svg.text((px + wx) / 2, y + 22, "Q, K, V through the ring's full barriers", 10.5, anchor="middle", fill="#2f6fb3")
    svg.line(wx - 96, y + 44, px + 96, y + 44, stroke="#c4610a", sw=1.2, dash="5,3", arrow="#c4610a")
    svg.text((px + wx) / 2, y + 58, "slots and Q freed through the empty barriers", 10.5, anchor="middle", fill="#c4610a")
    y += 100
    lines = [
        "Then round r + 1, on the other entry: with two entries the producer posts the next item before every consumer has read this one.",
        "The next item's Q and K/V tiles load while the consumers finish this item's last tiles and write its O: it is ready when they ask.",
    ]
    for t in lines:
        svg.text(20, y, t, 11, fill="#333")
        y += 16
    svg.height = y + 8
    svg.write(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--map", required=True, help="docs/results/stage11_smem_map.json")
    ap.add_argument("--images", required=True, help="folder for the SVG files")
    args = ap.parse_args()
    with open(args.map, encoding="utf-8") as f:
        maps = json.load(f)["maps"]
    os.makedirs(args.images, exist_ok=True)
    draw_smem_map(maps, os.path.join(args.images, "stage11_smem_map.svg"))
    draw_ring_parity(maps, os.path.join(args.images, "stage11_ring_parity.svg"))
    draw_persistent_flow(maps, os.path.join(args.images, "stage11_persistent_flow.svg"))


if __name__ == "__main__":
    main()
