"""Draws the loss curves of train_gpt.py's records, one line each, and their speeds in the legend.

    python3 python/examples/plot_losses.py runs/sdpa0.jsonl runs/sdpa1.jsonl runs/fc0.jsonl --out docs/results/torch_gpt_loss.svg

The label of a run is its attention, seed and packing, from the record's first line; the legend adds
its median tokens per second (its last line). PNG or SVG by the output's suffix.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    settings, steps, summary = {}, [], {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["kind"] == "settings":
                settings = r
            elif r["kind"] == "step":
                steps.append(r)
            else:
                summary = r
    return settings, steps, summary


def label(settings, summary):
    name = f"{settings.get('attention', '?')} seed {settings.get('seed', '?')}"
    if settings.get("varlen"):
        name += ", packed"
    speed = summary.get("tokens_per_s_median")
    return name + (f" ({speed / 1e3:.0f}k tokens/s)" if speed else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    gpu = ""
    for path in a.records:
        settings, steps, summary = read(path)
        gpu = gpu or settings.get("gpu", "")
        ax.plot([s["step"] for s in steps], [s["loss"] for s in steps], linewidth=1, label=label(settings, summary))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(a.title or f"a small byte-level GPT on the course's text ({gpu})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out)
    print(a.out)


if __name__ == "__main__":
    main()
