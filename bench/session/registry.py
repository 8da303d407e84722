"""Every experiment of every stage's module, by name, in the order `list` shows them.

A stage's module joins the session by being named in MODULES; nothing else needs to change.
"""
from . import common, stage05, stage06, stage07, stage09, stage10, stage11

MODULES = (common, stage05, stage06, stage07, stage09, stage10, stage11)


def experiments() -> dict:
    """name -> Experiment; two experiments of one name are a mistake caught here."""
    out = {}
    for module in MODULES:
        for exp in module.EXPERIMENTS:
            if exp.name in out:
                raise RuntimeError(f"two experiments named {exp.name} ({module.__name__})")
            out[exp.name] = exp
    return out


# Steps of bench/gpu_session.sh that stay there: they are about a fresh copy of the checkout (the
# README's two commands as a newcomer runs them), not about one stage's experiments.
BASH_ONLY = ("newcomer", "newcomer_test", "newcomer_test_start", "newcomer_wait")

# Steps of bench/gpu_session.sh that this driver does not run yet: the script stays the driver for them.
NOT_PORTED = ()
