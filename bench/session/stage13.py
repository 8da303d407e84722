"""Stage 13's experiments (decoding over a KV cache: split-KV, grouped heads packed into rows, a
paged cache): its tests on the GPU, the decode grid timed beside PyTorch SDPA, and the serving loop.

`serve13` runs `stage13_decode --serve` `rounds` times on the same requests: the reports in
stage13_serve.txt, one JSON line per round in stage13_serve.jsonl (tokens per second, the decode step's
median, the prefill's time, the pages' memory against a contiguous cache, the check's verdict).

`sweep13` runs, round by round, every point of the grid through stage13_decode (`--bench --reference
never`: inputs drawn on the GPU, timing only; one JSON line each in stage13_ours_round{r}.jsonl) and the same problems held contiguously through SDPA's flash,
cuDNN and efficient backends (GQA through `enable_gqa`; one process per round, stage13_sdpa.jsonl),
then `finish` writes stage13_sweep.csv: per point and round, our K + V bytes per second, each
backend's, and our rate over the best backend's. SDPA has no paged cache: a paged point is compared
with SDPA on the same problem held contiguously. A point whose K and V exceed `max_gib` is skipped
and listed in stage13_skipped.txt.

First it runs bench/read_ceiling (16-byte streaming loads over a buffer much larger than the L2): the
CSV gives each point as a fraction of the faster of its two forms. Not here yet: our runs interleaved
with SDPA's in one process (here they alternate process by process, round by round). SDPA's flash backend takes no mask, so at seq_q > 1 (causal new rows, bottom-right
aligned, given to SDPA as a boolean mask) it records its error and the other backends set the best.
"""
import csv
import json
import os

from . import sanitize
from .experiment import Command, Experiment, Where, entries_match, file_lines, grep, in_results
from .tools import SDPA_HEAD, ctest_gpu, ctest_summary

STAGE13 = "stages/13_decode/stage13_decode"
READ_CEILING = "bench/read_ceiling"

# The SDPA side of sweep13, run as `python3 -c SDPA_SCRIPT POINTS_JSON OUT_JSONL REPEAT`: the same
# problems as stage13_decode's (q (B, Hq, seq_q, d) against a contiguous cache of seq_k + seq_q keys,
# causal within the new rows, bottom-right aligned), each backend timed with CUDA events, the L2
# flushed before each run, the median kept.
SDPA_SCRIPT = SDPA_HEAD + r"""
points, out, repeat = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with open(out, "a") as f:
    for p in points:
        dtype = torch.bfloat16 if p["dtype"] == "bf16" else torch.float16
        B, hq, hk, d, nq, nk = p["batch"], p["heads"], p["kv_heads"], p["head_dim"], p["seq_q"], p["seq_k"] + p["seq_q"]
        q = torch.randn(B, hq, nq, d, device="cuda", dtype=dtype)
        k = torch.randn(B, hk, nk, d, device="cuda", dtype=dtype)
        v = torch.randn(B, hk, nk, d, device="cuda", dtype=dtype)
        # Causal within the new rows, bottom-right aligned: row i sees keys j <= nk - nq + i.
        mask = None
        if nq > 1:
            mask = torch.ones(nq, nk, dtype=torch.bool, device="cuda").tril(diagonal=nk - nq)
        gqa = hk != hq
        kv_bytes = 2.0 * B * hk * nk * d * 2
        for name, backend in BACKENDS.items():
            record = dict(p, backend=name, kv_bytes=kv_bytes)
            try:
                with sdpa_kernel(backend):
                    record["ms"] = time_call(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa),
                                             repeat)
                record["gbps"] = kv_bytes / record["ms"] * 1e-6
            except RuntimeError as e:  # a backend that does not take this shape
                record["error"] = str(e).splitlines()[0][:200]
            f.write(json.dumps(record) + "\n")
        del q, k, v
        torch.cuda.empty_cache()
"""


def _test13_commands(p, ctx):
    return ctest_gpu(ctx, "stage13", p["timeout"])


TEST13 = Experiment(
    name="test13",
    stage="13",
    description="the tests of stage 13 (ctest -R stage13): the GPU test (float64 reference, paged == contiguous at "
                "every page size, the append, run-to-run bits), the serving loop's scheduler and runs, the command line",
    targets=("stage13_decode", "test_stage13", "test_stage13_serve"),
    params={"timeout": 600},
    param_help={"timeout": "seconds before ctest fails one test"},
    commands=_test13_commands,
    outputs=(),  # CTest writes nothing but its log (WORK/logs/test13.log)
    summary=ctest_summary,
)


def sweep13_points(p) -> tuple:
    """(points, skipped): every (B, heads, seq_k, d, seq_q, cache) of the grid as a dict, B = 1 at
    `long_keys` added, and the points whose K + V would exceed max_gib GiB with the reason."""
    points, skipped = [], []
    shapes = [(b, n) for b in p["batches"] for n in p["lengths"]]
    if p["long_keys"] > 0:
        shapes.append((1, p["long_keys"]))
    for batch, seq_k in shapes:
        for heads in p["heads"]:
            hq, hk = (int(x) for x in heads.split(":"))
            for d in p["head_dims"]:
                for seq_q in p["seq_q"]:
                    kv_gib = 2.0 * batch * hk * (seq_k + seq_q) * d * 2 / 2**30
                    for cache in p["caches"]:
                        kind, _, page = cache.partition(":")
                        point = {"batch": batch, "heads": hq, "kv_heads": hk, "seq_k": seq_k, "head_dim": d,
                                 "seq_q": seq_q, "cache": kind, "page_size": int(page or 64), "dtype": p["dtype"]}
                        if kv_gib > p["max_gib"]:
                            skipped.append(f"{json.dumps(point)}: {kv_gib:.1f} GiB of K + V, over max_gib {p['max_gib']}")
                        else:
                            points.append(point)
    return points, skipped


def _ours_argv(ctx, point, out, repeat):
    return (ctx.exe(STAGE13), "--batch", str(point["batch"]), "--seq-k", str(point["seq_k"]), "--seq-q", str(point["seq_q"]),
            "--heads", str(point["heads"]), "--kv-heads", str(point["kv_heads"]), "--head-dim", str(point["head_dim"]),
            "--dtype", point["dtype"], "--cache", point["cache"], "--page-size", str(point["page_size"]), "--bench",
            "--repeat", str(repeat), "--warmup", "3", "--reference", "never", "--json", out)


def _sweep13_commands(p, ctx):
    out = ctx.results("sweep13")
    points, skipped = sweep13_points(p)
    cmds = []
    # SDPA runs each problem once per round, held contiguously, whatever caches our side runs it in.
    unique = {json.dumps({k: v for k, v in pt.items() if k not in ("cache", "page_size")}, sort_keys=True) for pt in points}
    sdpa = [json.loads(u) for u in sorted(unique)]
    for r in range(p["rounds"]):
        for point in points:
            cmds.append(Command(_ours_argv(ctx, dict(point, round=r), f"{out}/stage13_ours_round{r}.jsonl", p["repeat"])))
        cmds.append(Command(("python3", "-c", SDPA_SCRIPT, json.dumps([dict(pt, round=r) for pt in sdpa]),
                             f"{out}/stage13_sdpa.jsonl", str(p["repeat"])), env={"PYTHONUNBUFFERED": "1"}))
    header = tuple(skipped) or ("no point skipped",)
    cmds[0] = Command(cmds[0].argv, env=cmds[0].env, header=("skipped points:",) + header)
    # The GPU's read rate first: every point is also given as a fraction of it.
    ceiling = Command((ctx.exe(READ_CEILING), "--json", f"{out}/read_ceiling.jsonl"))
    return [ceiling] + cmds


def _problem_key(r):
    return tuple(r[k] for k in ("batch", "heads", "kv_heads", "seq_k", "head_dim", "seq_q", "dtype"))


def _sweep13_finish(p, ctx, where: Where):
    """stage13_sweep.csv: our rate per point and round beside each SDPA backend's, and the ratio to the best."""
    points, skipped = sweep13_points(p)
    with open(in_results(where, "stage13_skipped.txt"), "w") as f:
        f.write("".join(s + "\n" for s in skipped))
    sdpa = {}
    path = in_results(where, "stage13_sdpa.jsonl")
    for line in file_lines(path) if os.path.isfile(path) else []:
        r = json.loads(line)
        sdpa.setdefault((_problem_key(r), r["round"]), {})[r["backend"]] = r.get("gbps")
    path = in_results(where, "read_ceiling.jsonl")
    forms = [json.loads(x) for x in file_lines(path)] if os.path.isfile(path) else []
    ceiling = max((f["value"] for f in forms), default=None)  # GB/s, the faster of the two forms
    rows = []
    for rnd in range(p["rounds"]):
        path = in_results(where, f"stage13_ours_round{rnd}.jsonl")
        ours = {}
        for line in file_lines(path) if os.path.isfile(path) else []:
            r = json.loads(line)
            ours[(_problem_key(r), r["cache"], r["page_size"])] = r
        for point in points:
            got = ours.get((_problem_key(point), point["cache"], point["page_size"]), {})
            theirs = sdpa.get((_problem_key(point), rnd), {})
            rates = [g for g in theirs.values() if g]
            best = max(rates) if rates else None
            rows.append(dict(point, round=rnd, ours_gbps=got.get("gbps"), splits=got.get("splits"),
                             flash_gbps=theirs.get("flash"), cudnn_gbps=theirs.get("cudnn"),
                             efficient_gbps=theirs.get("efficient"),
                             ours_over_best=(got["gbps"] / best) if best and got.get("gbps") else None,
                             ceiling_gbps=ceiling,
                             ours_over_ceiling=(got["gbps"] / ceiling) if ceiling and got.get("gbps") else None,
                             passed=got.get("pass")))
    with open(in_results(where, "stage13_sweep.csv"), "w", newline="") as f:
        fields = list(rows[0]) if rows else ["batch"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    with open(in_results(where, "stage13_sweep_table.txt"), "w") as f:
        f.write(sweep13_table(rows, forms))


def sweep13_table(rows, forms) -> str:
    """One line per point: K + V in GiB, the splits, the medians over rounds of our GB/s and each SDPA
    backend's, ours over the best backend (with the rounds' smallest and largest) and over the ceiling."""
    def med(xs):
        xs = sorted(x for x in xs if x is not None and x != "")
        return xs[len(xs) // 2] if xs else None

    def fmt(x, spec=".0f"):
        return "-" if x is None else format(x, spec)

    gpu = ", ".join(sorted({f.get("gpu", "") for f in forms})) or "(no ceiling record)"
    date = ", ".join(sorted({f.get("date", "") for f in forms}))
    lines = [f"{gpu}, {date}: stage 13 beside SDPA on the same problem held contiguously, GB/s of K + V read;",
             "ceiling: bench/read_ceiling, " + "; ".join(f"{f['name']} {f['value']:.0f} GB/s" for f in forms),
             "",
             f"{'B':>3} {'Hq:Hk':>6} {'keys':>8} {'d':>4} {'nq':>3} {'cache':>9} {'GiB':>6} {'splits':>6}  {'ours':>5} "
             f"{'flash':>5} {'cudnn':>5} {'eff':>5}  {'/best':>5} {'(min-max)':>11} {'/ceiling':>8}"]
    by_point = {}
    for r in rows:
        cache = r["cache"] if r["cache"] == "contiguous" else f"paged:{r['page_size']}"
        by_point.setdefault((r["batch"], f"{r['heads']}:{r['kv_heads']}", r["seq_k"], r["head_dim"], r["seq_q"], cache,
                             r["dtype"]), []).append(r)
    for key, rs in by_point.items():
        b, heads, keys, d, nq, cache, _ = key
        hk = int(heads.split(":")[1])
        gib = 2.0 * b * hk * (keys + nq) * d * 2 / 2**30
        best = [r["ours_over_best"] for r in rs if r["ours_over_best"] is not None]
        spread = f"({min(best):.2f}-{max(best):.2f})" if best else ""
        lines.append(f"{b:>3} {heads:>6} {keys:>8} {d:>4} {nq:>3} {cache:>9} {gib:>6.2f} {fmt(med(r['splits'] for r in rs)):>6}  "
                     f"{fmt(med(r['ours_gbps'] for r in rs)):>5} {fmt(med(r['flash_gbps'] for r in rs)):>5} "
                     f"{fmt(med(r['cudnn_gbps'] for r in rs)):>5} {fmt(med(r['efficient_gbps'] for r in rs)):>5}  "
                     f"{fmt(med(best), '.2f'):>5} {spread:>11} {fmt(med(r['ours_over_ceiling'] for r in rs), '.2f'):>8}")
    return "\n".join(lines) + "\n"


SWEEP13 = Experiment(
    name="sweep13",
    stage="13",
    description="the decode grid (B 1/8/64, heads 32:32, 32:8, 64:8, 16:1, 1k-128k cached keys and B 1 at 1M, "
                "d 64/128, seq_q 1/4, contiguous and paged 16/64/256) through stage13_decode beside SDPA flash, "
                "cuDNN and efficient on the same problems held contiguously; GB/s of K + V and the fraction of the "
                "GPU's read rate (bench/read_ceiling first)",
    targets=("stage13_decode", "read_ceiling"),
    params={"batches": (1, 8, 64), "heads": ("32:32", "32:8", "64:8", "16:1"), "lengths": (1024, 8192, 32768, 131072),
            "long_keys": 1048576, "head_dims": (64, 128), "seq_q": (1, 4),
            "caches": ("contiguous", "paged:16", "paged:64", "paged:256"), "dtype": "bf16", "max_gib": 16.0,
            "repeat": 20, "rounds": 3},
    param_help={
        "batches": "B, sequences per call",
        "heads": "Hq:Hk pairs",
        "lengths": "keys cached per sequence",
        "long_keys": "the extra point at B = 1 with this many keys (0: none)",
        "head_dims": "d, 64 and/or 128",
        "seq_q": "new rows per sequence",
        "caches": "contiguous and/or paged:PAGE_SIZE",
        "dtype": "bf16 or fp16",
        "max_gib": "skip (and list) a point whose K + V exceed this many GiB",
        "repeat": "timed runs per point and round (CUDA events, L2 flushed, median)",
        "rounds": "rounds over the whole grid, ours then SDPA's each round",
    },
    commands=_sweep13_commands,
    outputs=("read_ceiling.jsonl", "stage13_ours_round{r}.jsonl", "stage13_sdpa.jsonl", "stage13_sweep.csv",
             "stage13_sweep_table.txt", "stage13_skipped.txt"),
    summary="stage13_sweep_table.txt",
    finish=_sweep13_finish,
)

def _serve13_argv(p, ctx, out):
    hq, hk = (int(x) for x in p["heads"].split(":"))
    argv = [ctx.exe(STAGE13), "--serve", "--requests", str(p["requests"]), "--max-batch", str(p["max_batch"]),
            "--prompt-min", str(p["prompt_min"]), "--prompt-max", str(p["prompt_max"]), "--prompt-dist", p["prompt_dist"],
            "--decode-steps", str(p["decode_steps"]), "--page-size", str(p["page_size"]), "--heads", str(hq),
            "--kv-heads", str(hk), "--head-dim", str(p["head_dim"]), "--dtype", p["dtype"], "--prefill", p["prefill"],
            "--seed", str(p["seed"]), "--json", f"{out}/stage13_serve.jsonl"]
    if p["pool_pages"] > 0:
        argv += ["--pool-pages", str(p["pool_pages"])]
    return tuple(argv)


def _serve13_commands(p, ctx):
    out = ctx.results("serve13")
    # The same loop `rounds` times (the same seed: the same requests), each report appended to one file, the
    # progress lines (stderr) to the log.
    return [Command(_serve13_argv(p, ctx, out), stdout=f"{out}/stage13_serve.txt", append=True,
                    header=(f"round {r}",), stderr=ctx.log("serve13")) for r in range(p["rounds"])]


def _serve13_summary(where: Where):
    """Per round: tokens per second, the median decode step, the prefill, the pages' memory against a contiguous
    cache, the verdict; then the median tokens per second over the rounds."""
    path = in_results(where, "stage13_serve.jsonl")
    records = [json.loads(x) for x in file_lines(path)] if os.path.isfile(path) else []
    lines = []
    for i, r in enumerate(records):
        lines.append(f"round {i}: {r['tokens_per_s']:.0f} tokens/s ({r['decode_tokens']} tokens, {r['wall_s']:.2f} s), "
                     f"step {r['step_ms_median']:.4f} ms median, prefill {r['prefill_attention_ms']:.1f} ms, "
                     f"pages {r['paged_bytes'] / 2**30:.2f} GiB against {r['contiguous_bytes'] / 2**30:.2f} GiB contiguous "
                     f"({r['paged_over_contiguous']:.2f}), {'PASS' if r['pass'] else 'MISMATCH'}")
    if records:
        rates = sorted(r["tokens_per_s"] for r in records)
        lines.append(f"median {rates[len(rates) // 2]:.0f} tokens/s over {len(rates)} rounds "
                     f"(min {rates[0]:.0f}, max {rates[-1]:.0f}); {records[0]['gpu']}")
    return lines or ["no record: see the log"]


def _check_serve13(p):
    if p["dtype"] not in ("bf16", "fp16"):
        raise ValueError(f"dtype must be bf16 or fp16, not {p['dtype']}")
    if p["prefill"] not in ("auto", "stage11", "stage07"):
        raise ValueError(f"prefill must be auto, stage11 or stage07, not {p['prefill']}")
    if p["prompt_dist"] not in ("uniform", "log-uniform"):
        raise ValueError(f"prompt_dist must be uniform or log-uniform, not {p['prompt_dist']}")
    entries_match("heads", r"\d+:\d+", "Hq:Hk pairs")({"heads": (p["heads"],)})


SERVE13 = Experiment(
    name="serve13",
    stage="13",
    description="the serving loop (stage13_decode --serve): 256 requests with prompts of 128-4096 tokens, 128 new tokens "
                "each, up to 64 decoded together over pages of 64 keys from a free list, 32:8 heads, d 128; tokens per "
                "second, the decode step's time, the prefill's, and the pages' memory against a contiguous cache",
    targets=("stage13_decode",),
    params={"requests": 256, "max_batch": 64, "prompt_min": 128, "prompt_max": 4096, "prompt_dist": "uniform",
            "decode_steps": 128, "page_size": 64, "pool_pages": 0, "heads": "32:8", "head_dim": 128, "dtype": "bf16",
            "prefill": "auto", "seed": 42, "rounds": 3},
    param_help={
        "requests": "requests, all queued at the start (--requests)",
        "max_batch": "sequences decoded together at most (--max-batch)",
        "prompt_min": "shortest prompt, tokens (--prompt-min)",
        "prompt_max": "longest prompt, tokens (--prompt-max)",
        "prompt_dist": "uniform or log-uniform prompt lengths (--prompt-dist)",
        "decode_steps": "T, new tokens per request (--decode-steps)",
        "page_size": "keys per page (--page-size)",
        "pool_pages": "pages in the pool (--pool-pages); 0: max_batch x the pages of the longest request",
        "heads": "Hq:Hk",
        "head_dim": "d, 64 or 128",
        "dtype": "bf16 or fp16",
        "prefill": "the prompts' attention: auto (stage 11 on sm_90a), stage11 or stage07 (--prefill)",
        "seed": "the prompt lengths and every input (--seed)",
        "rounds": "runs of the same loop, one after the other",
    },
    commands=_serve13_commands,
    outputs=("stage13_serve.txt", "stage13_serve.jsonl"),
    summary=_serve13_summary,
    check=_check_serve13,
)

SANITIZE13 = sanitize.experiment("13", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 13: a "
                                       "ragged paged batch with an empty sequence and causal new rows, GQA 4:1 and "
                                       "MQA, a contiguous cache with --splits, pages of 16 and 256, bf16 and fp16; the "
                                       "serving loop (--serve: prefill, pages written, taken and freed)")

EXPERIMENTS = (TEST13, SWEEP13, SERVE13, SANITIZE13)
