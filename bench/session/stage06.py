"""Stage 06's experiments (causal masking): compute-sanitizer over its cases.

Ported from the bash driver's step `sanitize` (stage 06) with the same commands.
"""
from . import sanitize

SANITIZE06 = sanitize.experiment("06", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 06: "
                                       "small problems with tails, Nq != Nk, causal rows that see no key, bnhd")

EXPERIMENTS = (SANITIZE06,)
