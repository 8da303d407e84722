#!/usr/bin/env python3
"""One rate over another, round by round, from the logs of bench/sdpa_compare.py.

    python3 bench/round_ratios.py A B LOG...

A and B name rows as the log prints them: an implementation of ours (`stage11`, the default step;
`stage11_step15`, a step of the road; `stage07`, ...) or one of SDPA's backends (`sdpa_cudnn`,
`sdpa_flash`). sdpa_compare.py's ratios_over_rounds.txt gives each point's ratio to SDPA, and stage
11's default over each other step timed beside it, as a median over the rounds with its min and
max; this lists every round, one line per point (dtype, d, N, mask) with A / B in each round of
each log, in the logs' order, and pairs any two rows, in the log of any earlier run:
`python3 bench/session.py run road11 --set road11.steps=0,9` (two steps) writes such a log
(WORK/logs/road11.log).
"""
import re
import sys

# A row of ours: "[  3/ 96] stage11  bf16 d=64  N=1024  B=16 H=32 non-causal  0.299 ms  459.95 TFLOP/s ..."
OURS = re.compile(r"\]\s+(\S+)\s+(bf16|fp16|fp32)\s+d=(\d+)\s+N=(\d+)\s+B=\s*\d+\s+H=\s*\d+\s+(causal|non-causal)\s+"
                  r"[\d.]+ ms\s+([\d.]+) TFLOP/s")
# SDPA's rows of one point: "[ 1/16] sdpa d=64 N=1024 non-causal: flash/bf16=286.8 cudnn/bf16=436.4 TFLOP/s"
SDPA = re.compile(r"\] sdpa d=(\d+) N=(\d+) (causal|non-causal): (.*) TFLOP/s")
ROUND = re.compile(r"round (\d+) of \d+")


def read(lines, rates, log=""):
    """Adds the rates of one log to `rates`: {(dtype, d, N, causal): {(log, round): {impl: TFLOP/s}}}.

    >>> rates = {}
    >>> read(["round 1 of 2",
    ...       "[  3/ 96] stage11         bf16 d=64  N=1024  B=16 H=32 non-causal     0.299 ms  459.95 TFLOP/s  (min 0.297)",
    ...       "[ 1/16] sdpa d=64 N=1024 non-causal: flash/bf16=286.8 cudnn/bf16=436.4 TFLOP/s",
    ...       "round 2 of 2",
    ...       "[  3/ 96] stage11         bf16 d=64  N=1024  B=16 H=32 non-causal     0.300 ms  457.00 TFLOP/s"], rates)
    >>> rates[("bf16", 64, 1024, False)][("", 1)]
    {'stage11': 459.95, 'sdpa_flash': 286.8, 'sdpa_cudnn': 436.4}
    >>> sorted(rates[("bf16", 64, 1024, False)][("", 2)])
    ['stage11']
    """
    rnd = (log, 0)
    for line in lines:
        m = ROUND.match(line)
        if m:
            rnd = (log, int(m.group(1)))
            continue
        m = SDPA.search(line)
        if m:
            point = (int(m.group(1)), int(m.group(2)), m.group(3) == "causal")
            for field in m.group(4).split():
                name, value = field.split("=")
                backend, dtype = name.split("/")
                rates.setdefault((dtype,) + point, {}).setdefault(rnd, {})["sdpa_" + backend] = float(value)
            continue
        m = OURS.search(line)
        if m:
            impl, dtype, d, n, mask, tflops = m.groups()
            rates.setdefault((dtype, int(d), int(n), mask == "causal"), {}).setdefault(rnd, {})[impl] = float(tflops)


def ratio_lines(rates, a, b):
    """One line per point where both were timed: A / B in each round.

    >>> ratio_lines({("bf16", 64, 1024, True): {("", 1): {"x": 2.0, "y": 1.0}, ("", 2): {"x": 3.0}}}, "x", "y")
    ['bf16 d= 64 N= 1024 causal      2.000']
    """
    out = []
    for key in sorted(rates):
        ratios = [r[a] / r[b] for _, r in sorted(rates[key].items()) if a in r and b in r and r[b] > 0]
        if ratios:
            dtype, d, n, causal = key
            out.append("%s d=%3d N=%5d %-11s " % (dtype, d, n, "causal" if causal else "non-causal") +
                       "  ".join("%.3f" % x for x in ratios))
    return out


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: round_ratios.py A B LOG...  (A, B: stage11, stage11_step15, sdpa_cudnn, ...)")
    a, b = argv[0], argv[1]
    rates = {}
    for log in argv[2:]:
        with open(log) as f:
            read(f, rates, log)
    lines = ratio_lines(rates, a, b)
    if not lines:
        sys.exit(f"round_ratios: no point has both {a} and {b} in {', '.join(argv[2:])}")
    print(f"{a} / {b}, round by round")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
