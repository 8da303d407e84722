#!/usr/bin/env python3
"""Stage 11's compiler traps: what ptxas and the SASS say about each pair of kernels in
stages/11_hopper_kernel/traps/traps.cu (a trap and its fix).

Compiles traps.cu for sm_90a to a cubin with `-Xptxas -v`, reads ptxas's messages and register
counts per kernel and, where `cuobjdump` is found (on PATH or beside nvcc), counts each kernel's
SASS instructions: HGMMA (and those carrying `gsb0`, waited for alone), WARPGROUP.ARRIVE,
WARPGROUP.DEPBAR (the wait), uniform-datapath instructions (opcodes starting with U), R2UR, and
all instructions but NOP. Each pair has an expectation, stated in words and checked on the counts.

    python3 bench/traps11.py --json docs/results/stage11_traps.json \\
                             --table docs/results/stage11_traps_table.txt
    python3 bench/traps11.py --check      # CTest: asserts what ptxas (and the SASS, if any) shows

--check exits 77 (CTest: skipped) where no nvcc is found. Python 3 standard library only.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join("stages", "11_hopper_kernel", "traps", "traps.cu")
INCLUDES = [os.path.join("common", "cuda", "include"), os.path.join("common", "include")]
NVCC_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-std=c++17", "-O3", "-Xptxas", "-v"]

# ptxas's messages that say it serialized the wgmma pipeline (bench/session.py fails a build
# with any of them): every one reads "wgmma.mma_async instructions are serialized ...".
SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized")


def _serialized(k):
    return [c for c, text in k["messages"] if SERIALIZED.search(text)]


# Each pair: the trap, its fix, what ptxas alone proves (checked by --check everywhere), and what
# the SASS should show (checked where cuobjdump exists). Counts: see count_sass().
PAIRS = [
    {
        "id": "1a",
        "title": "wgmma under a branch",
        "trap": "trap1_wgmma_under_branch",
        "fix": "fix1_wgmma_every_turn",
        "ptxas": "the trap draws a 'serialized' message (C7514), the fix none",
        "ptxas_holds": lambda t, f: "C7514" in _serialized(t) and not _serialized(f),
        "sass": "the trap waits on every HGMMA (gsb0 on all), the fix on fewer",
        "sass_holds": lambda t, f: t["hgmma"] > 0 and t["hgmma_gsb0"] == t["hgmma"] and f["hgmma_gsb0"] < f["hgmma"],
    },
    {
        "id": "1b",
        "title": "zero moved into a stage",
        "trap": "trap1_zero_moved_into_stage",
        "fix": "fix1_zero_fenced",
        "ptxas": "the trap draws C7515, the fix no 'serialized' message",
        "ptxas_holds": lambda t, f: "C7515" in _serialized(t) and not _serialized(f),
        "sass": "the trap waits on every HGMMA (gsb0 on all), the fix on fewer",
        "sass_holds": lambda t, f: t["hgmma"] > 0 and t["hgmma_gsb0"] == t["hgmma"] and f["hgmma_gsb0"] < f["hgmma"],
    },
    {
        "id": "2a",
        "title": "a branch alone",
        "trap": "trap2_branch_on_lane_value",
        "fix": "fix2_branch_on_vote",
        "ptxas": "neither draws a 'serialized' message (ptxas says nothing about it)",
        "ptxas_holds": lambda t, f: not _serialized(t) and not _serialized(f),
        "sass": "no R2UR in either: ptxas keeps a loop that starts afresh in the uniform datapath",
        "sass_holds": lambda t, f: t["r2ur"] == 0 and f["r2ur"] == 0,
    },
    {
        "id": "2b",
        "title": "a ring carried on",
        "trap": "trap2_items_lane_branch",
        "fix": "fix2_items_vote",
        "ptxas": "neither draws a 'serialized' message (ptxas says nothing about it)",
        "ptxas_holds": lambda t, f: not _serialized(t) and not _serialized(f),
        "sass": "the trap has fewer uniform (U*) instructions and more R2UR than the fix",
        "sass_holds": lambda t, f: t["uniform"] < f["uniform"] and t["r2ur"] > f["r2ur"],
    },
    {
        "id": "3",
        "title": "wgmma nobody reads",
        "trap": "trap3_output_left_out",
        "fix": "fix3_output_kept",
        "ptxas": "the trap uses at least 32 registers fewer (O's accumulators are gone)",
        "ptxas_holds": lambda t, f: t["registers"] + 32 <= f["registers"],
        "sass": "the trap has at most half the fix's HGMMA (S's only: every P V deleted)",
        "sass_holds": lambda t, f: 0 < t["hgmma"] and 2 * t["hgmma"] <= f["hgmma"],
    },
]


def find_tool(name, explicit=None, beside=None):
    """`explicit`, else `name` on PATH, else beside `beside` (nvcc's folder), else /usr/local/cuda/bin."""
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    found = shutil.which(name)
    if found:
        return found
    for folder in [beside, "/usr/local/cuda/bin"]:
        if folder and os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def compile_traps(nvcc, cubin):
    """nvcc -> cubin; returns ptxas's log (stderr and stdout). Raises on a failed build."""
    cmd = [nvcc, *NVCC_FLAGS, *[f"-I{os.path.join(ROOT, i)}" for i in INCLUDES], os.path.join(ROOT, SOURCE), "-o", cubin]
    run = subprocess.run(cmd, capture_output=True, text=True)
    log = run.stdout + run.stderr
    if run.returncode != 0:
        raise RuntimeError(f"nvcc failed ({run.returncode}):\n{' '.join(cmd)}\n{log}")
    return log


def parse_ptxas(log):
    """Per kernel: its messages [(code, text)], registers, spill bytes, from ptxas's -v log.

    >>> log = '''ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to x in the function 'k1'
    ... ptxas info    : Compiling entry function 'k1' for 'sm_90a'
    ... ptxas info    : Function properties for k1
    ...     0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
    ... ptxas info    : Used 110 registers, used 1 barriers, 40960 bytes smem'''
    >>> k = parse_ptxas(log)["k1"]
    >>> k["registers"], k["spill_stores"], k["spill_loads"], [c for c, _ in k["messages"]]
    (110, 8, 4, ['C7515'])
    """
    kernels = {}

    def kernel(name):
        return kernels.setdefault(name, {"messages": [], "registers": None, "spill_stores": None, "spill_loads": None})

    current = None
    for line in log.splitlines():
        m = re.search(r"\((C\d+)\)\s*(.*?)\s*in (?:the )?function '([^']+)'", line)
        if m:
            kernel(m.group(3))["messages"].append((m.group(1), m.group(2)))
            continue
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            kernel(current)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            kernel(current).update(spill_stores=int(m.group(1)), spill_loads=int(m.group(2)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            kernel(current)["registers"] = int(m.group(1))
    return kernels


SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def count_sass(dump):
    """Per kernel (cuobjdump -sass's "Function : NAME" sections), the instruction counts.

    >>> dump = '''
    ...         Function : k1
    ...         /*0000*/                   LDC R1, c[0x0][0x28] ;    /* 0x00000a00ff017b82 */
    ...         /*0010*/                   R2UR UR4, R2 ;
    ...         /*0020*/                   UIADD3 UR5, UR4, 0x800, URZ ;
    ...         /*0030*/                   WARPGROUP.ARRIVE ;
    ...         /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
    ...         /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
    ...         /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
    ...         /*0070*/              @!UP0 BRA 0x40 ;
    ...         /*0080*/                   NOP ;
    ... '''
    >>> c = count_sass(dump)["k1"]
    >>> [c[k] for k in ("hgmma", "hgmma_gsb0", "warpgroup_arrive", "warpgroup_depbar", "uniform", "r2ur", "total")]
    [2, 1, 1, 1, 1, 1, 8]
    """
    counts = {}
    current = None
    for line in dump.splitlines():
        m = re.match(r"\s*Function\s*:\s*(\S+)", line)
        if m:
            current = counts.setdefault(m.group(1), dict.fromkeys(
                ("hgmma", "hgmma_gsb0", "warpgroup_arrive", "warpgroup_depbar", "uniform", "r2ur", "total"), 0))
            continue
        m = SASS_LINE.match(line)
        if not m or current is None:
            continue
        words = m.group(1).split()
        if words and words[0].startswith("@"):  # a predicate guard: @P0, @!UP1
            words = words[1:]
        if not words:
            continue
        opcode = words[0]
        base = opcode.split(".")[0]
        if base == "NOP":
            continue
        current["total"] += 1
        if base == "HGMMA":
            current["hgmma"] += 1
            current["hgmma_gsb0"] += "gsb0" in m.group(1)
        elif opcode.startswith("WARPGROUP.ARRIVE"):
            current["warpgroup_arrive"] += 1
        elif opcode.startswith("WARPGROUP.DEPBAR"):
            current["warpgroup_depbar"] += 1
        elif base == "R2UR":
            current["r2ur"] += 1
        if base.startswith("U"):
            current["uniform"] += 1
    return counts


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), (V[\d.]+)", out)
    return f"{m.group(1)} ({m.group(2)})" if m else out.strip().splitlines()[-1]


def measure(nvcc, cuobjdump):
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "traps.cubin")
        log = compile_traps(nvcc, cubin)
        ptxas = parse_ptxas(log)
        sass = None
        if cuobjdump:
            dump = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
            sass = count_sass(dump)
    kernels = {}
    for name, k in ptxas.items():
        kernels[name] = {**k, "messages": [{"code": c, "text": t} for c, t in k["messages"]],
                         "sass": sass.get(name) if sass is not None else None}
    pairs = []
    for p in PAIRS:
        for role in ("trap", "fix"):
            if p[role] not in ptxas:
                raise RuntimeError(f"ptxas compiled no kernel {p[role]} (renamed in {SOURCE}?)")
        t, f = ptxas[p["trap"]], ptxas[p["fix"]]
        entry = {"id": p["id"], "title": p["title"], "trap": p["trap"], "fix": p["fix"],
                 "ptxas_expectation": p["ptxas"], "ptxas_holds": bool(p["ptxas_holds"](t, f)),
                 "sass_expectation": p["sass"], "sass_holds": None}
        if sass is not None:
            entry["sass_holds"] = bool(p["sass_holds"](sass[p["trap"]], sass[p["fix"]]))
        pairs.append(entry)
    return {"source": SOURCE, "nvcc": nvcc_version(nvcc), "flags": NVCC_FLAGS, "date": datetime.date.today().isoformat(),
            "cuobjdump": bool(cuobjdump), "kernels": kernels, "pairs": pairs}


def table(result):
    """The text table: one block of two lines per pair (the trap, then its fix)."""
    k = result["kernels"]
    head = ("pair", "kernel", "ptxas messages", "regs", "HGMMA", "gsb0", "ARRIVE", "DEPBAR", "U*", "R2UR", "total")
    widths = (30, 29, 22, 5, 6, 5, 7, 7, 5, 5, 6)
    lines = [f"Stage 11's compiler traps: stages/11_hopper_kernel/traps/traps.cu, nvcc {result['nvcc']} for sm_90a "
             f"({result['date']}); SASS counts from cuobjdump -sass"
             + ("" if result["cuobjdump"] else " (not run: no cuobjdump here)") + ".",
             "gsb0: HGMMA waited for alone; ARRIVE/DEPBAR: WARPGROUP.ARRIVE/DEPBAR; U*: uniform-datapath instructions;",
             "total: every instruction but NOP. ptxas messages: codes, C7519/C7517 are its injected arrives/waits.", ""]
    fmt = lambda row: "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    lines.append(fmt(head).rstrip())
    for p in result["pairs"]:
        for role, label in (("trap", f"{p['id']} {p['title']}"), ("fix", "")):
            name = p[role]
            codes = sorted({m["code"] for m in k[name]["messages"]})
            s = k[name]["sass"] or {}
            row = (label, name, " ".join(codes) or "-", k[name]["registers"], *(s.get(c, "n/a") for c in (
                "hgmma", "hgmma_gsb0", "warpgroup_arrive", "warpgroup_depbar", "uniform", "r2ur", "total")))
            lines.append(fmt(row).rstrip())
        holds = lambda h: "unchecked" if h is None else ("holds" if h else "DOES NOT HOLD")
        lines.append(f"    expected from ptxas: {p['ptxas_expectation']} ({holds(p['ptxas_holds'])})")
        lines.append(f"    expected in SASS:    {p['sass_expectation']} ({holds(p['sass_holds'])})")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc", help="nvcc to use (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)")
    ap.add_argument("--cuobjdump", help="cuobjdump to use (default: on PATH, else beside nvcc)")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--table", help="write the text table here")
    ap.add_argument("--check", action="store_true", help="fail unless every expectation that could be checked holds")
    args = ap.parse_args()

    nvcc = find_tool("nvcc", args.nvcc)
    if not nvcc:
        print("traps11: no nvcc found: skipped")
        return 77 if args.check else 1
    cuobjdump = find_tool("cuobjdump", args.cuobjdump, beside=os.path.dirname(nvcc))
    result = measure(nvcc, cuobjdump)
    text = table(result)
    sys.stdout.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)
    if args.check:
        import doctest

        failed = doctest.testmod(verbose=False).failed
        broken = [f"{p['id']} ({which})" for p in result["pairs"] for which in ("ptxas", "sass")
                  if p[f"{which}_holds"] is False]
        if failed or broken:
            print(f"traps11: FAILED: {failed} doctest(s); expectations broken: {', '.join(broken) or 'none'}")
            return 1
        print("traps11: every expectation checked holds" + ("" if cuobjdump else " (ptxas only: no cuobjdump)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
