"""The results page and the lessons' measured numbers, written from the records of docs/results/
(docs/make_results.py is the command line). Every record is data: CSV, JSON Lines, or
bench/sdpa_compare.py's tables as JSON (bench/records.py); nothing is read out of a printed table
or a sentence (STYLE.md habit 16).

Shared parts:
  readers.py      the sweeps' CSV and JSON, the roads, the CPU sweep, stage 10's ratios, the
                  ceilings, stage 11's first timings
  tables.py       sdpa_compare.py's tables files: stage 09's road, its pairs, ratios over rounds
  ncu_csv.py      Nsight Compute's records as CSV
  formatting.py   names of our stages and SDPA's backends, numbers, spans, anchors
  plots.py        matplotlib (optional) and the axes the plots share
  page.py         pieces several sections write alike: group headings, TFLOP/s tables, targets,
                  records shown as written, a road's tables
  ceilings.py     the peak rates: their table and the \\ceiling_* aliases
  site.py         the page in course order, the lessons' tables and lesson_numbers.doxy
One module per stage (its sections, its lesson aliases, its tables, its targets):
  stage05_06.py   our kernels beside SDPA in float32; the course's GPU targets
  stage07.py      the tensor cores beside SDPA flash and cuDNN, the road, the bridge table, \\s07_*
  stage09.py      the training step beside SDPA, the road's tables, the default on the grid
  stage09_numbers.py  \\s09_*
  stage10.py      the switches beside SDPA, the window, the packed batch, \\s10_*
  stage11.py      Hopper beside cuDNN, its road, its block order, its first timings
  cpu.py          stages 01 to 04
  newcomer.py     a reader's first run on the GPU machine
"""
