"""Every experiment of every stage's module, by name, in the order `list` shows them.

A stage's module joins the session by being named in MODULES; nothing else needs to change.
"""
from . import common, stage07, stage09, stage11

MODULES = (common, stage07, stage09, stage11)


def experiments() -> dict:
    """name -> Experiment; two experiments of one name are a mistake caught here."""
    out = {}
    for module in MODULES:
        for exp in module.EXPERIMENTS:
            if exp.name in out:
                raise RuntimeError(f"two experiments named {exp.name} ({module.__name__})")
            out[exp.name] = exp
    return out


# Steps of bench/gpu_session.sh that this driver does not run yet: the script stays the driver for them.
NOT_PORTED = (
    "newcomer", "newcomer_test", "newcomer_test_start", "newcomer_wait", "prebuilt", "sanitize", "road05",
    "groups11", "switches07", "stage10", "order07", "order09", "split09", "ncusource09", "ncusource11",
    "ncuvarlen09", "timing", "sweep", "quick", "ncu", "ncu05road", "ncu07", "ncu07road", "ncucudnn11",
    "ncuflash09", "ncu11", "ncu09", "ncu09at", "ncudrop", "ncugqa", "lessons",
)
