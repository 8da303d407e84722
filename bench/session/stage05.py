"""Stage 05's experiments (the shared-memory kernel, float32): every step of its road beside its
final kernel, and compute-sanitizer over its cases and its road.

Ported from the bash driver's steps `road05`, `ncu`, `ncu05road` and `sanitize` (stage 05)
with the same commands; ROAD05_SIZES and SANITIZE_TOOLS became parameters. road05's table, a
heredoc there, is road05_table() here.
"""
import csv
import os

from . import sanitize
from .experiment import Command, Experiment, Where, file_lines, grep, in_results
from .ncu import ANY_EXIT, NCU05ROAD_METRICS, metric_lines, profile, raw_page, report_lines
from .runner import SessionError


def _road05_commands(p, ctx):
    out = ctx.results("road05")
    return [Command((ctx.exe("bench/bench_gpu"), "--stages", "05", "--road05", "--sizes", *(str(n) for n in p["sizes"]),
                     "--head-dims", "64", "128", "--causal", "no", "--repeat", "10", "--warmup", "2",
                     "--json", f"{out}/road05.json", "--csv", f"{out}/road05.csv"))]


def road05_table(path: str) -> list:
    """The table of stage 05's road from road05.csv: each step's time, TFLOP/s, gain over the step
    before and check, per d and N."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["impl"].startswith("stage05")]
    g = rows[0]
    out = [f"{g['gpu']}, {g['date']}: stage 05's road, float32, non-causal, B*N = 16384, H*d = 2048, TFLOP/s (median)",
           f"{'step':>4}  {'name':<22} {'d':>4} {'N':>6} {'ms':>9} {'TFLOP/s':>8} {'gain':>6}  check"]
    for d in sorted({int(r["d"]) for r in rows}):
        for n in sorted({int(r["N"]) for r in rows}):
            prev = None
            for r in sorted((r for r in rows if int(r["d"]) == d and int(r["N"]) == n), key=lambda r: int(r["step"])):
                tf = float(r["tflops"])
                gain = f"{tf / prev:5.2f}x" if prev else "     -"
                out.append(f"{r['step']:>4}  {r['step_name']:<22} {d:>4} {n:>6} {float(r['median_ms']):9.3f} {tf:8.2f} "
                           f"{gain}  {r['check'] or '-'}")
                prev = tf
    return out


def _road05_finish(p, ctx, where: Where):
    """road05_table.txt: each step's time, TFLOP/s and gain over the step before, from road05.csv."""
    path = in_results(where, "road05.csv")
    if not os.path.isfile(path):
        return
    try:
        lines = road05_table(path)
    except (KeyError, ValueError, IndexError) as e:  # the script's heredoc failed the step: so does this
        raise SessionError(f"road05_table: {path} could not be read: {e!r}") from None
    with open(in_results(where, "road05_table.txt"), "w") as f:
        f.write("".join(line + "\n" for line in lines))


def _road05_summary(where: Where):
    """The points that failed their check and the kernels skipped, then the road's table."""
    return grep(where.log, r"BAD|MISMATCH|skipped", 20) + file_lines(in_results(where, "road05_table.txt"))


ROAD05 = Experiment(
    name="road05",
    stage="05",
    description="stage 05, every step of its road (float32), d 64/128, non-causal, each checked against the final kernel",
    targets=("bench_gpu", "mma_ceiling"),
    params={"sizes": (1024, 4096)},
    param_help={"sizes": "sequence lengths N (--sizes; B*N = 16384, H*d = 2048)"},
    commands=_road05_commands,
    outputs=("road05.json", "road05.csv", "road05_table.txt"),
    summary=_road05_summary,
    finish=_road05_finish,
)

SANITIZE05 = sanitize.experiment("05", "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stage 05: "
                                       "small problems with tails, Nq != Nk, causal rows that see no key, and every "
                                       "step of its road")


NCU_ARGS = ("--stages", "05", "--sizes", "4096", "--head-dims", "64", "128", "--causal", "no", "--repeat", "1",
            "--warmup", "0", "--check", "false", "--schedule-ablation", "false", "--json", "/tmp/ncu.json",
            "--csv", "/tmp/ncu.csv")
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis",
                "WarpStateStats")
NCU_COUNTERS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
                "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "smsp__inst_executed.sum",
                "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum")


def _ncu_commands(p, ctx):
    out, log, bench = ctx.results("ncu"), ctx.log("ncu"), ctx.exe("bench/bench_gpu")
    head = ("ncu", "--clock-control", "none", "-k", "regex:attention_kernel", "--launch-count", "2")
    sections = [w for s in NCU_SECTIONS for w in ("--section", s)]
    report, counters = f"{out}/ncu_stage05", f"{out}/ncu_stage05_metrics"
    return [profile((*head, *sections), report, (bench, *NCU_ARGS)), raw_page(report, log),
            # The counters in a run of their own: a metric this ncu does not know must not cost the report above.
            profile((*head, "--metrics", ",".join(NCU_COUNTERS)), counters, (bench, *NCU_ARGS), ok=ANY_EXIT),
            raw_page(counters, log, ok=ANY_EXIT)]


def _ncu_summary(where: Where):
    """Each launch's kernel, time, throughputs, occupancy, registers and shared memory, then its counters."""
    return report_lines(where.results, "ncu_stage05",
                        counters=r"dram__|lts__|ffma|bank_conflicts|wavefronts|inst_executed.sum|local")


NCU = Experiment(
    name="ncu",
    stage="05",
    description="Nsight Compute on the stage 05 kernel, B=4 N=4096, d=64 (H=32) and d=128 (H=16), one launch each",
    targets=("bench_gpu",),
    params={},
    param_help={},
    commands=_ncu_commands,
    # Two launches each: d 64, then d 128. docs/results/ keeps the CSVs (the reports open in Nsight Compute).
    outputs=("ncu_stage05.ncu-rep", "ncu_stage05.csv", "ncu_stage05_metrics.ncu-rep", "ncu_stage05_metrics.csv"),
    summary=_ncu_summary,
)


def _ncu05road_commands(p, ctx):
    out, log = ctx.results("ncu05road"), ctx.log("ncu05road")
    metrics = ctx.known_metrics(NCU05ROAD_METRICS, log)
    cmds = []
    for s in range(7):
        # bench_gpu runs each step twice, untimed then timed after an L2 flush, steps 0 to 5 first and
        # the final kernel last: launch 2s+1 of the regex, the timed run, is step s.
        report = f"{out}/ncu_stage05_road_step{s}"
        cmds += [profile(("timeout", "300", "ncu", "--clock-control", "none", "-k",
                          "regex:attention_kernel|row_per_thread_kernel|block_tile_kernel", "--launch-skip", str(2 * s + 1),
                          "--launch-count", "1", "--metrics", metrics), report,
                         (ctx.exe("bench/bench_gpu"), "--stages", "05", "--road05", "--sizes", "2048", "--head-dims", "64",
                          "--causal", "no", "--repeat", "1", "--warmup", "0", "--check", "false", "--json", "/tmp/ncu.json",
                          "--csv", "/tmp/ncu.csv")),
                 raw_page(report, log)]
    return cmds


def _ncu05road_summary(where: Where):
    """Each step's kernel, time, bank conflicts, active warps and registers."""
    lines = []
    for s in range(7):
        lines += [f"---- step {s}"] + metric_lines(in_results(where, f"ncu_stage05_road_step{s}.csv"),
                                                   r"gpu__time|bank_conflicts|warps_active|registers_per")
    return lines


NCU05ROAD = Experiment(
    name="ncu05road",
    stage="05",
    description="Nsight Compute on every step of stage 05's road, float32, d=64 N=2048 (B=8 H=32) non-causal: memory "
                "throughput, bank conflicts, occupancy, registers, instructions, one launch each",
    targets=("bench_gpu",),
    params={},
    param_help={},
    commands=_ncu05road_commands,
    outputs=("ncu_stage05_road_step{s}.ncu-rep", "ncu_stage05_road_step{s}.csv"),
    summary=_ncu05road_summary,
)

EXPERIMENTS = (ROAD05, NCU, NCU05ROAD, SANITIZE05)
