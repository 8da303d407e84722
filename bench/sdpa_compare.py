#!/usr/bin/env python3
"""Stages 05/06 beside PyTorch SDPA on the same GPU, in the same run, timed the same way.

Runs bench_gpu (our kernels) and then, where torch is importable, PyTorch's
scaled_dot_product_attention pinned to one backend at a time with
torch.nn.attention.sdpa_kernel: flash, cudnn, efficient (and math for the sizes whose N x N
matrices fit). Every point is timed with CUDA events after warm-up runs, with the L2 flushed
(a buffer four times the L2 overwritten) before each timed run, and the median of the runs is
kept: the method bench_gpu uses. FLOPs follow fa::attention_flops: 4*B*H*N*N*d, halved for
causal.

flash and cudnn have no float32 kernels; they are recorded as unsupported in fp32 and timed in
bf16 instead, for scale (stage 07 is the stage that competes with them).

Writes OUT_DIR/gpu_sweep.csv (columns impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,
sm_clock_mhz,date) and OUT_DIR/gpu_sweep.json, and prints the table of ratios ours / theirs.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import warnings

BACKENDS = ["flash", "cudnn", "efficient", "math"]


def flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def sm_clock_mhz():
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # no NVML here: the column says -1
        return -1


def run_bench_gpu(exe, args, out_json, out_csv):
    cmd = [exe, "--sizes", *map(str, args.sizes), "--head-dims", *map(str, args.head_dims),
           "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--json", out_json, "--csv", out_csv]
    print("running", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(out_json) as f:
        return json.load(f)


def time_torch(fn, warmup, repeat, flush):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for i in range(repeat):
        flush.fill_(i & 0xFF)  # evict the inputs the previous run left in L2
        starts[i].record()
        fn()
        stops[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])


def run_sdpa(args, gpu_name, date):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # A backend pinned to a dtype it lacks warns before it raises; the raise is recorded below.
    warnings.filterwarnings("ignore", message=".*(kernel not used|runtime disabled|Expected query, key).*")

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    torch.backends.cuda.matmul.allow_tf32 = False  # the math backend in true float32
    torch.backends.cudnn.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    flush = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    rows = []
    total = len(args.head_dims) * len(args.sizes) * 2
    done = 0
    for d in args.head_dims:
        for n in args.sizes:
            b, h = max(1, args.tokens // n), max(1, args.width // d)
            gen = torch.Generator(device="cuda").manual_seed(1234)
            q32, k32, v32 = (torch.randn(b, h, n, d, device="cuda", generator=gen) for _ in range(3))
            for causal in (False, True):
                done += 1
                for name in BACKENDS:
                    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                        if name == "math" and dtype_name == "bf16":
                            continue
                        if name == "math":
                            # N x N scores and probabilities per head, in float32, several copies.
                            need = 4.0 * b * h * n * n * 3
                            free, _ = torch.cuda.mem_get_info()
                            if need > 0.6 * free:
                                rows.append(dict(impl="sdpa_math", dtype=dtype_name, B=b, H=h, N=n, d=d, causal=int(causal),
                                                 median_ms="", tflops="", gpu=gpu_name, sm_clock_mhz="", date=date,
                                                 note="skipped: N x N matrices too large"))
                                continue
                        q, k, v = (t.to(dtype) for t in (q32, k32, v32))
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
                        row = dict(impl="sdpa_" + name, dtype=dtype_name, B=b, H=h, N=n, d=d, causal=int(causal), gpu=gpu_name,
                                   date=date)
                        try:
                            with sdpa_kernel(backends[name]):
                                ms = time_torch(fn, args.warmup, args.repeat, flush)
                            row.update(median_ms=ms, tflops=flops(b, h, n, d, causal) / (ms * 1e-3) * 1e-12,
                                       sm_clock_mhz=sm_clock_mhz(), note="")
                        except (RuntimeError, torch.OutOfMemoryError) as e:  # no kernel for this dtype/shape
                            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                            row.update(median_ms="", tflops="", sm_clock_mhz="", note="unsupported: " + first[:120])
                        rows.append(row)
                        del q, k, v
                line = " ".join(
                    f"{r['impl'][5:]}/{r['dtype']}={r['tflops']:.1f}" for r in rows[-7:] if r["tflops"] != "" and r["N"] == n
                    and r["d"] == d and r["causal"] == int(causal))
                print(f"[{done:2d}/{total}] sdpa d={d} N={n} {'causal' if causal else 'non-causal'}: {line} TFLOP/s", flush=True)
            del q32, k32, v32
            torch.cuda.empty_cache()
    return rows


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-exe", required=True, help="path to the bench_gpu executable")
    parser.add_argument("--out-dir", default=os.path.join(here, "..", "docs", "results"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--tokens", type=int, default=16384, help="B * N")
    parser.add_argument("--width", type=int, default=2048, help="H * d")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    ours = run_bench_gpu(args.bench_exe, args, os.path.join(args.out_dir, "bench_gpu.json"),
                         os.path.join(args.out_dir, "bench_gpu.csv"))
    gpu_name, date = ours["gpu"], ours["date"]
    rows = [dict(impl=r["impl"], dtype=r["dtype"], B=r["B"], H=r["H"], N=r["N"], d=r["d"], causal=int(r["causal"]),
                 median_ms=r["median_ms"], tflops=r["tflops"], gpu=gpu_name, sm_clock_mhz=r["sm_clock_mhz"], date=date, note="")
            for r in ours["results"]]
    try:
        import torch

        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    if have_torch:
        print(f"torch {torch.__version__}, timing SDPA backends on {torch.cuda.get_device_name(0)}", flush=True)
        rows += run_sdpa(args, gpu_name, date)
    else:
        print("torch with CUDA is not importable here: only our stages are in the results", flush=True)

    columns = ["impl", "dtype", "B", "H", "N", "d", "causal", "median_ms", "tflops", "gpu", "sm_clock_mhz", "date"]
    csv_path = os.path.join(args.out_dir, "gpu_sweep.csv")
    with open(csv_path, "w") as f:
        f.write(",".join(columns) + "\n")
        for r in rows:
            f.write(",".join(str(r[c]) for c in columns) + "\n")
    with open(os.path.join(args.out_dir, "gpu_sweep.json"), "w") as f:
        json.dump(dict(gpu=gpu_name, date=date, max_sm_clock_mhz=ours["max_sm_clock_mhz"], method=ours["method"],
                       torch=(torch.__version__ if have_torch else None), results=rows), f, indent=1)

    # The table: ours against SDPA's efficient backend in float32, and stage 06's causal saving.
    def find(impl, dtype, n, d, causal):
        for r in rows:
            if (r["impl"], r["dtype"], r["N"], r["d"], r["causal"]) == (impl, dtype, n, d, int(causal)) and r["tflops"] != "":
                return r
        return None

    print()
    print(f"{gpu_name}, {date}: TFLOP/s in float32 (ratio = ours / SDPA efficient fp32; target >= 0.50)")
    print(f"{'d':>4} {'N':>6} {'causal':>7} {'stage05':>8} {'stage06':>8} {'sdpa_eff':>9} {'05/eff':>7} {'06/eff':>7}"
          f" {'flash bf16':>11} {'cudnn bf16':>11}")
    worst = None
    for d in args.head_dims:
        for n in args.sizes:
            for causal in (False, True):
                s5, s6, eff = find("stage05", "fp32", n, d, causal), find("stage06", "fp32", n, d, causal), find(
                    "sdpa_efficient", "fp32", n, d, causal)
                fl, cu = find("sdpa_flash", "bf16", n, d, causal), find("sdpa_cudnn", "bf16", n, d, causal)
                fmt = lambda r: f"{r['tflops']:.2f}" if r else "-"  # noqa: E731
                r5 = s5["tflops"] / eff["tflops"] if s5 and eff else None
                r6 = s6["tflops"] / eff["tflops"] if s6 and eff else None
                if r6 is not None:
                    worst = r6 if worst is None else min(worst, r6)
                print(f"{d:>4} {n:>6} {str(causal):>7} {fmt(s5):>8} {fmt(s6):>8} {fmt(eff):>9} "
                      f"{(f'{r5:.2f}' if r5 else '-'):>7} {(f'{r6:.2f}' if r6 else '-'):>7} {fmt(fl):>11} {fmt(cu):>11}")
    print()
    print("stage 06 causal / non-causal time (target <= 0.55 at N >= 4096):")
    for d in args.head_dims:
        for n in args.sizes:
            nc, c = find("stage06", "fp32", n, d, False), find("stage06", "fp32", n, d, True)
            if nc and c:
                print(f"  d={d:<4} N={n:<6} {c['median_ms'] / nc['median_ms']:.3f}")
    if worst is not None:
        print(f"\nworst stage06 / sdpa_efficient fp32 ratio: {worst:.2f}")
    print(f"wrote {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
