#!/usr/bin/env python3
"""Draws the roofline of the main page as SVG (no third-party modules).

The roofline of a machine: attainable FLOP/s = min(peak FLOP/s, intensity * memory bandwidth),
with intensity in FLOPs per byte of HBM traffic. The points are attention's intensity, computed
here from the byte counts the main page derives (one head; B and H cancel):

  unfused   S and P go through HBM: write S, read S, write P, read P (4 N^2 elements of s bytes)
            plus q, k, v, o:                     I = 4 N^2 d / (s (4 N^2 + 4 N d))
  fused     q, o once; k, v once per block of Br query rows, when L2 keeps nothing:
                                                 I = 4 N^2 d / (s (2 N d + 2 N d ceil(N / Br)))
            and q, k, v, o exactly once, when L2 serves every re-read:
                                                 I = 4 N^2 d / (s 4 N d) = N / s

Usage: make_roofline.py --out roofline.svg [--seq 4096 --head-dim 64]
"""

import argparse
import math

# NVIDIA H100 SXM5 (80 GB HBM3): peak figures from NVIDIA's data sheet, dense (no sparsity).
HBM_TBPS = 3.35          # TB/s
PEAK_BF16_TFLOPS = 989.4  # tensor cores, dense bf16/fp16 with fp32 accumulation
PEAK_FP32_TFLOPS = 66.9   # CUDA cores, fp32 fused multiply-add


def intensity_unfused(n, d, s):
    return 4.0 * n * n * d / (s * (4.0 * n * n + 4.0 * n * d))


def intensity_fused_no_reuse(n, d, s, br):
    return 4.0 * n * n * d / (s * (2.0 * n * d + 2.0 * n * d * math.ceil(n / br)))


def intensity_fused_ideal(n, d, s):
    return 4.0 * n * n * d / (s * 4.0 * n * d)


class Plot:
    """Log-log axes mapped onto an SVG canvas."""

    def __init__(self, width, height, xlim, ylim, margin=(70, 30, 30, 60)):
        self.w, self.h = width, height
        self.left, self.right, self.top, self.bottom = margin
        self.xlim = [math.log10(v) for v in xlim]
        self.ylim = [math.log10(v) for v in ylim]
        self.items = []

    def x(self, v):
        f = (math.log10(v) - self.xlim[0]) / (self.xlim[1] - self.xlim[0])
        return self.left + f * (self.w - self.left - self.right)

    def y(self, v):
        f = (math.log10(v) - self.ylim[0]) / (self.ylim[1] - self.ylim[0])
        return self.h - self.bottom - f * (self.h - self.top - self.bottom)

    def add(self, text):
        self.items.append(text)

    def line(self, x0, y0, x1, y1, color, width=2.0, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{self.x(x0):.1f}" y1="{self.y(y0):.1f}" x2="{self.x(x1):.1f}" '
                 f'y2="{self.y(y1):.1f}" stroke="{color}" stroke-width="{width}"{d}/>')

    def text(self, px, py, s, size=12, anchor="start", color="#222", weight="normal"):
        self.add(f'<text x="{px:.1f}" y="{py:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'fill="{color}" font-weight="{weight}">{s}</text>')

    def svg(self):
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}" font-family="Helvetica, Arial, sans-serif">\n'
                f'<rect x="0" y="0" width="{self.w}" height="{self.h}" fill="#ffffff"/>\n')
        return head + "\n".join(self.items) + "\n</svg>\n"


def attainable(i, peak):
    return min(peak, i * HBM_TBPS)


def draw(n, d):
    xlim, ylim = (1, 10000), (1, 2000)
    p = Plot(760, 470, xlim, ylim)

    # Grid and axes.
    for e in range(0, 5):
        v = 10 ** e
        p.line(v, ylim[0], v, ylim[1], "#e3e3e3", 1)
        p.text(p.x(v), p.h - p.bottom + 18, f"{v:g}", anchor="middle")
    for v in (1, 10, 100, 1000):
        p.line(xlim[0], v, xlim[1], v, "#e3e3e3", 1)
        p.text(p.left - 8, p.y(v) + 4, f"{v:g}", anchor="end")
    p.add(f'<rect x="{p.left}" y="{p.top}" width="{p.w - p.left - p.right}" '
          f'height="{p.h - p.top - p.bottom}" fill="none" stroke="#888"/>')
    p.text((p.left + p.w - p.right) / 2, p.h - 18, "arithmetic intensity (FLOPs per byte of HBM traffic)",
           size=13, anchor="middle")
    p.add(f'<text transform="translate(20,{(p.top + p.h - p.bottom) / 2:.0f}) rotate(-90)" font-size="13" '
          f'text-anchor="middle" fill="#222">attainable TFLOP/s</text>')

    # The roofs: bandwidth slope up to each ridge, then flat at the peak.
    roofs = [(PEAK_BF16_TFLOPS, "#1a7f37", "bf16 tensor cores"), (PEAK_FP32_TFLOPS, "#c4610a", "fp32 CUDA cores")]
    ridge_max = PEAK_BF16_TFLOPS / HBM_TBPS
    p.line(xlim[0], attainable(xlim[0], PEAK_BF16_TFLOPS), ridge_max, PEAK_BF16_TFLOPS, "#1f5fbf", 2.5)
    # The bandwidth label runs along the slope, just above it.
    x0, x1 = 2.0, 8.0
    angle = math.degrees(math.atan2(p.y(x1 * HBM_TBPS) - p.y(x0 * HBM_TBPS), p.x(x1) - p.x(x0)))
    p.add(f'<text transform="translate({p.x(x0):.1f},{p.y(x0 * HBM_TBPS) - 8:.1f}) rotate({angle:.1f})" '
          f'font-size="12" fill="#1f5fbf" font-weight="bold">HBM3 {HBM_TBPS:g} TB/s</text>')
    for peak, color, label in roofs:
        ridge = peak / HBM_TBPS
        p.line(ridge, peak, xlim[1], peak, color, 2.5)
        p.line(ridge, ylim[0], ridge, peak, color, 1, dash="4 4")
        p.text(p.x(xlim[1]) - 6, p.y(peak) - 8, f"{label}: {peak:g} TFLOP/s", anchor="end", color=color,
               weight="bold")
        p.text(p.x(ridge) + 4, p.y(ylim[0]) - 6, f"ridge {ridge:.0f}", color=color, size=11)

    # Attention's intensity at (n, d): unfused points, fused ranges along the roof.
    cases = [
        # label, precision bytes, peak, color, block rows
        ("fp32", 4, PEAK_FP32_TFLOPS, "#c4610a", 64),
        ("bf16", 2, PEAK_BF16_TFLOPS, "#1a7f37", 128),
    ]
    for name, s, peak, color, br in cases:
        iu = intensity_unfused(n, d, s)
        px, py = p.x(iu), p.y(attainable(iu, peak))
        p.add(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="6" fill="#d1242f" stroke="#fff" stroke-width="1.5"/>')
        p.text(px + 9, py + 16, f"unfused, {name}: {iu:.0f}", color="#d1242f", size=11.5)

        lo, hi = intensity_fused_no_reuse(n, d, s, br), intensity_fused_ideal(n, d, s)
        steps = 40
        pts = []
        for k in range(steps + 1):
            i = lo * (hi / lo) ** (k / steps)
            pts.append(f"{p.x(i):.1f},{p.y(attainable(i, peak)):.1f}")
        p.add(f'<polyline points="{" ".join(pts)}" fill="none" stroke="#6f42c1" stroke-width="7" '
              f'stroke-opacity="0.45" stroke-linecap="round"/>')
        for i in (lo, hi):
            p.add(f'<circle cx="{p.x(i):.1f}" cy="{p.y(attainable(i, peak)):.1f}" r="4.5" fill="#6f42c1"/>')
        # Label under the flat part of the range, clear of the slope and of the red labels.
        label = f"fused, {name}, Br={br}: {lo:.0f} to {hi:.0f}"
        if lo < peak / HBM_TBPS:
            p.text(p.x(peak / HBM_TBPS) + 8, p.y(peak) + 20, label, color="#6f42c1", size=11.5)
        else:
            p.text(p.x(hi) + 4, p.y(peak) + 20, label, anchor="end", color="#6f42c1", size=11.5)

    p.text(p.left + 10, p.top + 18, f"H100 SXM, attention with N = {n}, d = {d}", size=13, weight="bold")
    p.text(p.left + 10, p.top + 36, "red: S and P through HBM; purple: fused, from K, V re-read per Q block",
           size=11, color="#555")
    p.text(p.left + 10, p.top + 51, "(no L2 reuse) to Q, K, V, O moved exactly once (perfect L2 reuse)",
           size=11, color="#555")
    return p.svg()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(draw(args.seq, args.head_dim))


if __name__ == "__main__":
    main()
