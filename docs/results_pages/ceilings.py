"""The peak rates the lessons measure the kernels against: bench/mma_ceiling.cu's (mma.sync bf16
and fp16, ex2.approx, fp32 FMA: mma_ceiling.jsonl) and bench/wgmma_ceiling.cu's (wgmma with A in
shared memory or in registers: wgmma_ceiling.jsonl). One alias per quantity, for every lesson and
the main page (\\ceiling_mma_bf16 and the like), and the table stage 07's section shows."""

from collections import OrderedDict

from .formatting import fmt_num, md

NAMES = {"mma_bf16": "`mma.sync` m16n8k16 bf16", "mma_fp16": "`mma.sync` m16n8k16 fp16",
         "ex2": "`ex2.approx.ftz.f32`", "ffma": "fp32 FMA"}


def ceilings_table(meta, out):
    """The peak rates mma_ceiling measured on the GPU of the sweep, when the record has them."""
    ceilings = meta.get("ceilings") or {}
    lines = [f"| {NAMES.get(k, md(k))} | {fmt_num(float(v['value']))} {md(v.get('unit', ''))} | "
             f"{md(v.get('sm_clock_mhz', ''))} MHz |" for k, v in ceilings.items() if k in NAMES]
    if not lines:
        return
    out.append("Ceilings of the same GPU, measured by `bench/mma_ceiling.cu` (one instruction issued back to back "
               "from registers on every SM):")
    out.append("")
    out.append("| instruction | rate | SM clock |")
    out.append("|---|---:|---:|")
    out.extend(lines)
    out.append("")


def ceiling_aliases(ceilings, wgmma):
    """\\ceiling_* from the lines of mma_ceiling.jsonl (`ceilings`) and wgmma_ceiling.jsonl
    (`wgmma`), by name. A rate "per SM per clock" is the line's rate divided by its sm_count and by
    the SM clock the tool read while it ran (its sm_clock_mhz), so a lesson that quotes one quotes
    that clock too (\\ceiling_mma_clock_mhz). "–" where a line or a field is missing."""
    def num(lines, name, key, digits):
        try:
            return f"{float(lines[name][key]):.{digits}f}"
        except (KeyError, TypeError, ValueError):
            return "–"

    aliases = OrderedDict()
    aliases["ceiling_mma_bf16"] = num(ceilings, "mma_bf16", "value", 0)
    aliases["ceiling_mma_fp16"] = num(ceilings, "mma_fp16", "value", 0)
    aliases["ceiling_mma_per_sm_clock"] = num(ceilings, "mma_bf16", "per_sm_per_clock", 0)
    aliases["ceiling_mma_clock_mhz"] = num(ceilings, "mma_bf16", "sm_clock_mhz", 0)
    aliases["ceiling_sm_count"] = num(ceilings, "mma_bf16", "sm_count", 0)
    aliases["ceiling_ex2"] = num(ceilings, "ex2", "value", 1)
    aliases["ceiling_ex2_per_sm_clock"] = num(ceilings, "ex2", "per_sm_per_clock", 0)
    aliases["ceiling_ffma"] = num(ceilings, "ffma", "value", 1)
    aliases["ceiling_gpu"] = str(ceilings.get("mma_bf16", {}).get("gpu") or "–")
    aliases["ceiling_date"] = str(ceilings.get("mma_bf16", {}).get("date") or "–")
    aliases["ceiling_wgmma_ss_bf16"] = num(wgmma, "wgmma_ss_bf16", "value", 0)
    aliases["ceiling_wgmma_rs_bf16"] = num(wgmma, "wgmma_rs_bf16", "value", 0)
    try:
        over = float(wgmma["wgmma_ss_bf16"]["value"]) / float(ceilings["mma_bf16"]["value"])
        aliases["ceiling_wgmma_over_mma"] = f"{100 * (over - 1):.0f}%"
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        aliases["ceiling_wgmma_over_mma"] = "–"
    return aliases
