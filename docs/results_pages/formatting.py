"""Names and numbers as the results page and the lessons print them: our stages and SDPA's
backends, cells of a Doxygen markdown table, spans of ratios, anchors."""

import math
import re

SDPA_ORDER = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"]
HALF_DTYPES = ("bf16", "fp16")
SDPA_NAMES = {
    "sdpa_flash": "SDPA flash",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA efficient",
    "sdpa_math": "SDPA math",
}
LESSON_PAGES = set()  # pages the site has (--lesson-pages): only those are linked


def truthy(value):
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "causal")


def whole_number(text):
    """int(text) for a run of ASCII digits ('07', '4095'), else None."""
    return int(text) if text.isascii() and text.isdigit() else None


def stage_number(impl):
    """'stage07' -> '07'; None for any other name (a step, a mode, SDPA's backends)."""
    digits = impl[len("stage"):] if impl.startswith("stage") else ""
    return digits if whole_number(digits) is not None else None


def stage_step(impl):
    """'stage09_step4' -> ('09', 4): a step of a stage's road, as the sweeps name its rows; None
    for any other name (stage09_step4_deterministic is a mode of the step, not the step)."""
    stage, sep, step = impl.partition("_step")
    if not sep or stage_number(stage) is None or whole_number(step) is None:
        return None
    return stage_number(stage), whole_number(step)


def impl_key(impl):
    """Our stages first, in course order, then SDPA's backends."""
    number = stage_number(impl)
    if number is not None:
        return (0, int(number), impl)
    if impl in SDPA_ORDER:
        return (1, SDPA_ORDER.index(impl), impl)
    return (2, 0, impl)


def impl_name(impl):
    number = stage_number(impl)
    if number is not None:
        return f"stage {number}"
    if impl == "stage09_deterministic":
        return "stage 09, deterministic dQ"
    return SDPA_NAMES.get(impl, impl)


def impl_ref(impl):
    """A link to the lesson for our stages (when the site has the page), plain text otherwise."""
    number = stage_number(impl)
    if number is not None:
        return f'\\ref {impl} "stage {number}"' if impl in LESSON_PAGES else f"stage {number}"
    if impl == "stage09_deterministic":
        return impl_ref("stage09") + ", deterministic dQ"
    return SDPA_NAMES.get(impl, impl)


def lesson_ref(anchor, page="stage10"):
    """' (\\ref anchor)' when the site has the lesson `page`, else nothing."""
    return f" (\\ref {anchor})" if page in LESSON_PAGES else ""


def md(text):
    """Escapes what Doxygen's markdown would otherwise interpret inside table cells."""
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def fmt_bytes(n):
    """Binary prefixes, three significant digits: '796 KiB', '2.02 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1000 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{fmt_num(n)} {unit}"
        n /= 1024
    return f"{fmt_num(n)} GiB"


def fmt_num(x, digits=3):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def count_words(n):
    """2117640202 -> "2.12 billion", 303059534 -> "303 million", 21070 -> "21 thousand"."""
    for scale, word in ((1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if n >= scale:
            return f"{n / scale:.3g} {word}"
    return f"{n:.0f}"


def slug(*parts):
    return re.sub(r"[^A-Za-z0-9]+", "_", "_".join(str(p) for p in parts)).strip("_").lower()


def span(values, unit=""):
    """'1980 MHz' or '1755 to 1980 MHz' or 'A, B'."""
    vals = sorted({str(v).strip() for v in values if str(v).strip()})
    if not vals:
        return "unknown"
    nums = []
    for v in vals:
        try:
            nums.append(float(v))
        except ValueError:
            nums = None
            break
    if nums and unit:
        lo, hi = min(nums), max(nums)
        return f"{lo:g} {unit}" if lo == hi else f"{lo:g} to {hi:g} {unit}"
    return ", ".join(vals)


def span_ratios(values):
    """'lo to hi' of the values that are not None, to two places ('lo' when both round alike; '–'
    when there is none)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo} to {hi}"


def pow2_label(n, _pos=None):
    n = int(round(n))
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)
