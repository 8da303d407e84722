"""The GPU session driver: each stage's experiments as records, built, run and packed in one call.

Run it from the repository root, on the GPU machine, with the launcher beside this package:

    python3 bench/session.py list                       # every experiment, its parameters and defaults
    python3 bench/session.py run road11 sweep09 --set road11.steps=0,8,9
    python3 bench/session.py run road11 --dry-run       # every command, nothing run

`run` unpacks .deps/*.deb into /tmp/deps, configures the build folder (--build, default build-gpu:
Hopper only, warnings as errors) and builds the union of the experiments' targets (none of them
when they name none), then runs each experiment in the order given. Every experiment of the call writes into one results folder,
WORK/results/EXP/ (WORK: --work, default /tmp/fa-session, kept between calls on one machine), its
log into WORK/logs/EXP.log, and its summary lines with its time into WORK/logs/summary.txt. Logs and
results are packed into $OUT/session.tgz (--out; default $OUT, else /tmp/fa-out) beside a copy of
the summary after each experiment and every --pack-every seconds (30) during one. Exit 0 when every
command succeeded, 1 when one failed, 2 on bad input (an unknown experiment or parameter, a value of
the wrong type), before anything runs.

The layout: experiment.py (the Experiment and Command records, parameters typed by their
defaults), runner.py (build, run, summary, packing), tools.py (the sdpa_compare.py comparison every
stage shares, the packed batch, block-order rounds), sanitize.py (compute-sanitizer's cases),
ncu.py (Nsight Compute's counters, reports and tables), one module per stage (stage05.py ...
stage11.py, common.py for what belongs to none, newcomer.py for the fresh copy's checks, whose
shell half is bench/newcomer.sh), registry.py (which modules join), cli.py, and the tests
test_*.py (no GPU: CTest's session_driver runs them all). What the experiments measure is data:
sdpa_compare.py writes every table it prints as cells in tables.json (bench/records.py), the
Nsight experiments write CSV from their reports (bench/ncu_pages.py), and docs/results_pages/
reads those files, never the printed text.

The experiments replace the bash driver, bench/gpu_session.sh (its steps took environment
variables; removed once every step had an experiment: `git log -- bench/gpu_session.sh`). A
record of docs/results/ made with a step of it is made again with the experiment of the same name,
each variable now a parameter whose help in `list` names it (QUICK_STAGES="07 09": --set
quick.stages=07,09; BUILD=DIR: --build DIR, TUNING=OFF: --tuning OFF, BUILD_TARGETS: the
experiments' own targets).
"""
