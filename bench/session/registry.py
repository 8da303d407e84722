"""Every experiment of every stage's module, by name, in the order `list` shows them.

A stage's module joins the session by being named in MODULES; nothing else needs to change.
"""
from . import common, newcomer, stage05, stage06, stage07, stage09, stage10, stage11, stage12, stage13, torchop

MODULES = (common, newcomer, stage05, stage06, stage07, stage09, stage10, stage11, stage12, stage13, torchop)


def experiments() -> dict:
    """name -> Experiment; two experiments of one name are a mistake caught here."""
    out = {}
    for module in MODULES:
        for exp in module.EXPERIMENTS:
            if exp.name in out:
                raise RuntimeError(f"two experiments named {exp.name} ({module.__name__})")
            out[exp.name] = exp
    return out

