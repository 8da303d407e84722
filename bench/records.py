"""Measured tables as data: every table bench/sdpa_compare.py prints is also written, cell by cell,
into a JSON file beside the text, and docs/results_pages/ reads that file back. Nothing downstream
parses a printed table (STYLE.md habit 16).

One file holds one run's tables:

    {
      "format": "flashcourse-tables", "version": 1,
      "meta":   {"gpu": "NVIDIA H200", "date": "2026-11-26", "command": "...", "rounds": 3,
                 "tokens": 16384, "width": 2048, "default_steps": {"09": 9}, ...},
      "tables": [
        {"kind": "stage09_pair",
         "meta": {"dtype": "bf16", "title": "NVIDIA H200, 2026-11-26: stage 07 forward + ..."},
         "columns": [{"key": "d", "header": "d", "width": 4, "format": "d"}, ...],
         "rows": [[64, 4096, false, 268.0, ...], ...]}
      ]
    }

A cell is a number, a string, a boolean, null (printed "-": not timed, or no ratio), or, for the
ratios over rounds, a list [median, min, max]. Numbers keep their full precision; the column's
format says how the printed table rounded them. `meta` of the file says what the run was (the
GPU, the date, the command, the rounds, the problems' size: B*N tokens and H*d width, and the
step each stage's default kernel was in that run); `meta` of a table what varies per table (the
dtype, the step, the title line as printed).

The kinds and their column keys (the printed heads in brackets):

  stage09_pair    d N causal fb [09 f+b] fb_flash_tflops [flash] fb_cudnn_tflops [cudnn]
                  fb_vs_flash [/flash] fb_vs_cudnn [/cudnn] bwd [09 bwd] bwd_vs_flash [/flash]
                  bwd_vs_cudnn [/cudnn] bwd_ms [bwd ms] det_ms [det ms] det_vs_atomic [det/at] bad
                  (stage 07's forward + stage 09's default backward beside SDPA; meta: dtype)
  stage09_step    d N causal fb [f+b] fb_vs_default [/09] fb_vs_flash [/flash] bwd [bwd]
                  bwd_vs_default [/09] bwd_vs_flash [/flash] bwd_ms det_ms det_vs_atomic bad
                  (another step of stage 09's road; meta: dtype, impl, step, backward_only)
  stage07         d N causal stage07 flash cudnn vs_flash vs_cudnn pct_of_mma bad (meta: dtype, ceiling)
  stage11         d N causal stage11 stage07 flash cudnn vs_cudnn vs_flash vs_stage07 pct_of_wgmma
                  [vs_cudnn_over_rounds] bad (meta: dtype, ceiling, rounds)
  fp32            d N causal stage05 stage06 sdpa_efficient vs_eff05 vs_eff06 flash_half cudnn_half
                  (the float32 stages; meta: half, the 16-bit type of the last two)
  causal_share    d N causal_over_full (stage 06's causal time over its non-causal one)
  ratios          dtype d N causal, then one column per ratio, key "A/B/PASS" (A's rate over B's
                  in PASS, cells [median, min, max] over the rounds); meta: rounds
  refused         impl dtype pass d N causal note (what an SDPA backend refused, and why)
  worst           what value dtype d N causal (the lowest ratio of each kind compared)
  worst_over_rounds  what value lo hi dtype d N causal (the lowest median over rounds)

read_tables() gives a Run whose tables are Tables with rows as dicts (column key -> cell).
Python 3 standard library only: both bench/ (on the GPU machine) and docs/ (in CI) import it.
"""
from __future__ import annotations

import dataclasses
import json

FORMAT = "flashcourse-tables"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its key in the data, its printed head, width and format ("d", ".1f", ".2f",
    ".3f", "s" for text, "bool" for True/False, "ratio" for [median, min, max], "flag" for a mark
    printed after the row, "  BAD" for a point that failed its check, with no head)."""
    key: str
    header: str
    width: int
    format: str = ".1f"

    def text(self, cell) -> str:
        """The cell as the printed table shows it ("-" for null)."""
        if self.format == "flag":
            return f"  {self.header}" if cell else ""
        if cell is None:
            return "-"
        if self.format == "ratio":
            med, lo, hi = cell
            return f"{med:.2f} [{lo:.2f}, {hi:.2f}]"
        if self.format == "bool":
            return str(bool(cell))
        if self.format == "s":
            return str(cell)
        if self.format.endswith("%"):  # ".1f%": a percentage with its sign
            return f"{cell:{self.format[:-1]}}%"
        return f"{cell:{self.format}}"


@dataclasses.dataclass
class Table:
    """A printed table and its cells. rows are lists in column order; row_dicts() keys them."""
    kind: str
    columns: list
    meta: dict = dataclasses.field(default_factory=dict)
    rows: list = dataclasses.field(default_factory=list)

    def add(self, *cells):
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.kind}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def keys(self) -> list:
        return [c.key for c in self.columns]

    def row_dicts(self) -> list:
        keys = self.keys()
        return [dict(zip(keys, r)) for r in self.rows]

    def head_line(self, sep=" ") -> str:
        return sep.join(f"{c.header:>{c.width}}" for c in self.columns if c.format != "flag")

    def row_line(self, row, sep=" ") -> str:
        pairs = list(zip(self.columns, row))
        return (sep.join(f"{c.text(cell):>{c.width}}" for c, cell in pairs if c.format != "flag")
                + "".join(c.text(cell) for c, cell in pairs if c.format == "flag"))

    def to_json(self) -> dict:
        return {"kind": self.kind, "meta": self.meta,
                "columns": [dataclasses.asdict(c) for c in self.columns], "rows": self.rows}

    @staticmethod
    def from_json(obj) -> "Table":
        return Table(obj["kind"], [Column(**c) for c in obj["columns"]], dict(obj.get("meta", {})),
                     [list(r) for r in obj["rows"]])


@dataclasses.dataclass
class Run:
    """One run's tables and what the run was."""
    meta: dict = dataclasses.field(default_factory=dict)
    tables: list = dataclasses.field(default_factory=list)

    def of_kind(self, kind: str) -> list:
        return [t for t in self.tables if t.kind == kind]

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "meta": self.meta, "tables": [t.to_json() for t in self.tables]}


# The columns of the kinds docs/ reads, as sdpa_compare.py prints them (key, head, width, format).
POINT = [Column("d", "d", 4, "d"), Column("N", "N", 6, "d"), Column("causal", "causal", 7, "bool")]
STAGE09_PAIR = POINT + [
    Column("fb", "09 f+b", 7), Column("fb_flash_tflops", "flash", 7), Column("fb_cudnn_tflops", "cudnn", 7),
    Column("fb_vs_flash", "/flash", 7, ".2f"), Column("fb_vs_cudnn", "/cudnn", 7, ".2f"),
    Column("bwd", "09 bwd", 7), Column("bwd_vs_flash", "/flash", 7, ".2f"), Column("bwd_vs_cudnn", "/cudnn", 7, ".2f"),
    Column("bwd_ms", "bwd ms", 8, ".3f"), Column("det_ms", "det ms", 8, ".3f"),
    Column("det_vs_atomic", "det/at", 7, ".2f"), Column("bad", "BAD", 0, "flag")]
STAGE09_STEP = POINT + [
    Column("fb", "f+b", 7), Column("fb_vs_default", "/09", 7, ".2f"), Column("fb_vs_flash", "/flash", 7, ".2f"),
    Column("bwd", "bwd", 7), Column("bwd_vs_default", "/09", 7, ".2f"), Column("bwd_vs_flash", "/flash", 7, ".2f"),
    Column("bwd_ms", "bwd ms", 8, ".3f"), Column("det_ms", "det ms", 8, ".3f"),
    Column("det_vs_atomic", "det/at", 7, ".2f"), Column("bad", "BAD", 0, "flag")]
RATIO_POINT = [Column("dtype", "dtype", 5, "s"), Column("d", "d", 4, "d"), Column("N", "N", 6, "d"),
               Column("causal", "causal", 7, "bool")]


def ratio_column(a: str, b: str, pass_: str, header: str) -> Column:
    """The column of A's rate over B's in PASS, its cells [median, min, max] over the rounds."""
    return Column(f"{a}/{b}/{pass_}", header, 19, "ratio")


def dumps(run: Run) -> str:
    """The run as JSON text with a line per column and per row, so that a diff of two runs shows
    the rows that changed (json.dump's indent would give every cell a line of its own)."""
    one = lambda x: json.dumps(x, ensure_ascii=False)
    out = ["{", f' "format": {one(FORMAT)}, "version": {VERSION},', f' "meta": {one(run.meta)},', ' "tables": [']
    for i, t in enumerate(run.tables):
        out.append(f'  {{"kind": {one(t.kind)}, "meta": {one(t.meta)},')
        out.append('   "columns": [' + ",\n               ".join(one(dataclasses.asdict(c)) for c in t.columns) + "],")
        out.append('   "rows": [' + ",\n            ".join(one(r) for r in t.rows) + "]}" + ("," if i + 1 < len(run.tables) else ""))
    out += [" ]", "}"]
    return "\n".join(out) + "\n"


def write_tables(path: str, run: Run):
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(run))


def read_tables(path: str) -> Run:
    """The run of a tables file; ValueError when the file is not one (wrong format or version)."""
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    if obj.get("format") != FORMAT or obj.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} file of version {VERSION}")
    return Run(dict(obj.get("meta", {})), [Table.from_json(t) for t in obj.get("tables", [])])
