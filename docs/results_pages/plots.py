"""What the page's plots share: matplotlib (optional: without it the page keeps its tables and says
why the plots are missing), the axes of every TFLOP/s-against-N plot, the road's step-by-step plot
and the grouped axes of stage 10's. Each stage's own plots live in its module; they test HAVE_MPL
and use plt through this module, so that one switch turns every plot off."""

from .formatting import SDPA_NAMES, pow2_label

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    HAVE_MPL = True
except ImportError:  # the page keeps its tables and says why the plots are missing
    plt = FuncFormatter = NullFormatter = None
    HAVE_MPL = False


def log2_n_axis(ax):
    """N in powers of two along x: 512, 1k, 16k."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(pow2_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length N")


def style_tflops_against_n(ax, title):
    """The axes every TFLOP/s-against-N plot shares: N in powers of two, TFLOP/s from 0."""
    log2_n_axis(ax)
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)


def save(fig, path):
    """Lays the figure out, writes it and frees it."""
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def finish_tflops_against_n(fig, ax, title, path):
    """The shared axes, the legend beside the plot, then the file."""
    style_tflops_against_n(ax, title)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    save(fig, path)


def plot_road(rows, title, path, sdpa="sdpa_flash"):
    """TFLOP/s step by step along the road, one line per (d, causal), the SDPA backend `sdpa` (flash
    for stage 07, cuDNN for stage 11) as the last point."""
    steps = sorted({(r["step"], r["step_name"]) for r in rows if r["kind"] == "road"})
    labels = [f"{s}: {name}" for s, name in steps] + [SDPA_NAMES.get(sdpa, sdpa)]
    fig, ax = plt.subplots(figsize=(8.2, 4.4), dpi=110)
    for i, (d, causal) in enumerate(sorted({(r["d"], r["causal"]) for r in rows})):
        cell = {r["step"]: r["tflops"] for r in rows if r["kind"] == "road" and (r["d"], r["causal"]) == (d, causal)}
        flash = [r["tflops"] for r in rows if r["kind"] == "sdpa" and r["impl"] in (sdpa, "") and (r["d"], r["causal"]) == (d, causal)]
        xs = [k for k, (s, _) in enumerate(steps) if s in cell]
        ax.plot(xs, [cell[steps[k][0]] for k in xs], color=f"C{i}", marker="o",
                linestyle="-" if not causal else "--", label=f"d = {d}, {'causal' if causal else 'non-causal'}")
        if flash:
            ax.plot([len(steps)], flash[:1], color=f"C{i}", marker="s", linestyle="none")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    save(fig, path)


def style_groups(ax, labels):
    """A categorical x axis: one group of bars or dots per label."""
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)
