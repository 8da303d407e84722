#!/usr/bin/env python3
"""Does the way a kernel is timed change its figure? SDPA flash's forward, timed four ways in one process.

Every ratio the course gives against PyTorch SDPA comes from sdpa_compare.py's time_torch(): the
L2 flushed (a buffer four times the L2 filled) before each run, CUDA events around the one call,
the median of the runs, the runs enqueued back to back. A figure from another harness that
disagrees with it is either noise or method; this script times the same calls by

  events    time_torch() itself, as every table of the course does;
  do_bench  Triton's triton.testing.do_bench (when importable), its median: an independent
            harness (it zeroes a 256 MB buffer before each run and picks its own count of runs
            from a first estimate, about 100 ms of them);
  isolated  time_torch()'s flush and events, but with the device synchronized before each run:
            every run starts on an idle GPU, as after a host round trip (clock ramps and launch
            latency show here);
  graph     20 calls captured in one CUDA graph, replayed, the time divided by 20: no flush, no
            launch gap, each call finding the previous one's K and V in L2 where they fit;

on bf16, d 64 and 128, N 1024, 4096 and 16384 (B*N = 16384 tokens, H*d = 2048 as everywhere in
the course), causal and not, in --rounds interleaved rounds, and prints each method's time over
events' with the median, min and max over the rounds. A method whose ratio moves with the round
is noise; one that stays away from 1 is a difference of method, and its column says which.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdpa_compare import causal_values, flops, sm_clock_mhz, time_torch  # noqa: E402


def time_isolated(fn, warmup, repeat, flush):
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for i in range(repeat):
        flush.fill_(i & 0xFF)
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def time_graph(fn, calls=20, replays=10):
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as graph capture asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--tokens", type=int, default=16384, help="B * N")
    parser.add_argument("--width", type=int, default=2048, help="H * d")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of events and isolated")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        sys.exit("timing_check needs torch with CUDA")
    if not torch.cuda.is_available():
        sys.exit("timing_check needs a CUDA GPU")
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    flush = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    methods = ["events", "isolated", "graph"] + (["do_bench"] if do_bench else [])
    points = [(d, n, c) for d in args.head_dims for n in args.sizes for c in causal_values(args.causal)]
    ms = {(p, m): [] for p in points for m in methods}
    clocks = {m: [] for m in methods}
    for rnd in range(args.rounds):
        print(f"round {rnd + 1} of {args.rounds}", flush=True)
        for d, n, causal in points:
            b, h = max(1, args.tokens // n), max(1, args.width // d)
            gen = torch.Generator(device="cuda").manual_seed(1234)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                for m in methods:
                    if m == "events":
                        t = time_torch(fn, args.warmup, args.repeat, flush)[0]
                    elif m == "isolated":
                        t = time_isolated(fn, args.warmup, args.repeat, flush)
                    elif m == "graph":
                        t = time_graph(fn)
                    else:
                        t = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    ms[(d, n, causal), m].append(t)
                    clocks[m].append(sm_clock_mhz())
            del q, k, v

    gpu = torch.cuda.get_device_name(0)
    lines = [f"SDPA flash bf16 forward on {gpu}, torch {torch.__version__}, {args.rounds} rounds; "
             f"each method's time over events' (median [min, max] over the rounds; < 1: that method times it faster)",
             "SM clock read after each method's timing (MHz, median): "
             + ", ".join(f"{m} {statistics.median(c):.0f}" for m, c in clocks.items())]
    if not do_bench:
        lines.append("do_bench: triton is not importable here")
    lines.append(f"{'d':>4} {'N':>6} {'mask':>7} {'events ms':>10} {'TFLOP/s':>8} " + " ".join(f"{m:>22}" for m in methods[1:]))
    for d, n, causal in points:
        b, h = max(1, args.tokens // n), max(1, args.width // d)
        ev = ms[(d, n, causal), "events"]
        cells = []
        for m in methods[1:]:
            r = [a / e for a, e in zip(ms[(d, n, causal), m], ev)]
            cells.append(f"{statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]")
        med = statistics.median(ev)
        lines.append(f"{d:>4} {n:>6} {'causal' if causal else 'full':>7} {med:>10.3f} {flops(b, h, n, d, causal) / med * 1e-9:>8.1f} "
                     + " ".join(f"{c:>22}" for c in cells))
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
