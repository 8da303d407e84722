"""The GPU session driver: each stage's experiments as records, built, run and packed in one call.

Run it from the repository root, on the GPU machine, with the launcher beside this package:

    python3 bench/session.py list                       # every experiment, its parameters and defaults
    python3 bench/session.py run road11 sweep09 --set road11.steps=0,8,9
    python3 bench/session.py run road11 --dry-run       # every command, nothing run

`run` unpacks .deps/*.deb into /tmp/deps, configures the build folder (--build, default build-gpu:
Hopper only, warnings as errors) and builds the union of the experiments' targets, then runs each
experiment in the order given. Every experiment of the call writes into one results folder,
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
stage11.py, and common.py for what belongs to none), registry.py (which modules join), cli.py,
test_session.py (no GPU: CTest runs it). bench/gpu_session.sh stays the driver for the newcomer
steps (a fresh copy of the checkout) and for any step not ported yet (`list` names them).
"""
