#!/usr/bin/env python3
"""Writes the results page of the flashcourse site from the measured data in docs/results/.

Inputs (any may be missing; the page then says what is not there yet), all records as data (CSV,
JSON, JSON Lines: nothing is read out of a printed table, STYLE.md habit 16):
  gpu_sweep.csv    columns impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date
                   (bench/ writes it: our GPU stages and PyTorch SDPA's backends, same shapes;
                   later sweeps add columns, e.g. step, which are not needed here, and pass:
                   forward, backward or fwd+bwd, read when present; a file without it holds
                   forward rows only). Beside it, gpu_sweep.json (the sweep's record: PyTorch
                   version, timing, the mma.sync ceiling) and road.csv (stage 07's road: each
                   step's TFLOP/s and gain); road11.csv (stage 11's road, with each step's ratio
                   to SDPA cuDNN) and stage11_first_contact.json (the first timings of stage 11:
                   `python3 bench/session.py run bringup11` writes it beside its log; shown until
                   the sweep has stage 11);
                   stage09_steps_quick.json and the other stage09_*.json (stage 09's road and grid:
                   bench/sdpa_compare.py's tables as data, bench/records.py's format, beside the
                   printed record); mma_ceiling.jsonl and wgmma_ceiling.jsonl (the ceilings the
                   lessons quote); stage10.csv (bench/sdpa_compare.py --stages 10: stage 10's
                   ratios, each a median over rounds, which stage 10's lesson quotes as \\s10_*
                   aliases); Nsight Compute's records ncu_*.csv.
  cpu_sweep.jsonl  one JSON object per line, as the stage executables print with --json
                   (stage,title,B,H,Nq,Nk,d,causal,layout,first_ms,median_ms,gflops,
                    peak_rss_bytes,rss_before_bytes,intermediate_bytes,pass,machine,date)
Outputs: a Doxygen markdown page (anchor `results`) with tables, plots as PNG (matplotlib; tables
only when it is missing), and checks against the performance targets of the course; with
--lesson-tables, the tables the lessons show (stage07_bridge_table.txt, stage09_*_table.txt) and
the numbers they quote (lesson_numbers.doxy, Doxygen aliases).

The work is in docs/results_pages/ (its __init__.py lists the modules: one per stage, and the
readers, formatting, plots and page pieces they share).

Usage: make_results.py --gpu-csv F --cpu-jsonl F --out results.md --images DIR [--road-csv F]
"""

import argparse
import os
import sys

# bench/ holds the formats the records are written in, standard library only, shared with the
# scripts that write them: records.py (sdpa_compare.py's tables), ncu_pages.py (Nsight Compute's CSV).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

from results_pages.site import write_site  # noqa: E402  (after bench/ is on the path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-csv", required=True)
    ap.add_argument("--cpu-jsonl", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--lesson-pages", default="", help="comma-separated page names the site has (stage01,...)")
    ap.add_argument("--road-csv", help="stage 07's road (default: road.csv beside --gpu-csv)")
    ap.add_argument("--road11-csv", help="stage 11's road (default: road11.csv beside --gpu-csv)")
    ap.add_argument("--stage09-steps", help="stage 09's road: the tables file of `python3 bench/session.py run quick` "
                    "with --set quick.steps09=... (default: stage09_steps_quick.json beside --gpu-csv)")
    ap.add_argument("--lesson-tables", help="folder for the tables the lessons \\verbinclude (stage07_bridge_table.txt, "
                    "stage09_road_table.txt) and lesson_numbers.doxy")
    write_site(ap.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
