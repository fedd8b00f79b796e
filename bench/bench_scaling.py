"""How a training step's time and memory grow with the sequence length T, for the three variants.

    python bench/bench_scaling.py                          # every variant, T = 128 ... 4096 (about 11 min on 2 cores)
    python bench/bench_scaling.py --variants perceiver --lengths 1024 2048
    python bench/bench_scaling.py --quick --no_record      # T = 32, 64 on a few tokens: a check that it runs
    python bench/plot_scaling.py                           # the figure, bench/results/scaling.png

The model is the handout's (n_layer 4, n_head 8, n_embd 256, vocabulary 256), built by src/'s model.GPT with
block_size = T and no dropout; the perceiver with bottleneck_dim m = 64. Its attention costs O(T·m) where the
vanilla's and rope's cost O(T²): this measures what that buys in a training step. Every point sees the same
number of tokens, batch B = 16384 / T, random tokens.

Per (variant, T), one training step is: forward with the loss, backward, torch.optim.AdamW (fused) step, under
the bf16 autocast decision training makes (`choose_precision`; --fp32 forces fp32).
- seconds: the median of the timed steps after warm-up; at large T fewer of both (--point_budget).
- memory: on CUDA torch.cuda.max_memory_allocated minus the memory allocated before the first step; on CPU
  each point runs in a fresh process and step_peak_bytes = its peak RSS (ru_maxrss) minus its RSS just before
  the first step (peak_rss_bytes, baseline_rss_bytes). A process killed (for memory) gives a skipped point.
- flops: torch.utils.flop_counter on one forward+backward, counted on the meta device (no compute, the same
  count); analytic_flops is the formula, for comparison. achieved_gflops = flops / seconds; peak_gflops is
  the best of a few square matmuls in the same precision on the same device, measured once per run, and
  predicted_seconds = flops / peak: the time the step's FLOPs alone would take at that rate.
- skipped points: estimated memory over --memory_fraction of the machine's (memory_estimate), or the same
  variant's previous T over --max_point_seconds; each states why.

Prints a table and appends one JSON row per point (bench "scaling") to --out as it goes. Run it on a quiet
machine: another process's threads on the same cores slow CPU steps (tiny ones up to 100-fold); each row
records the 1-minute load average just before its point (load_average).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_epoch  # noqa: E402

import machine as policy  # noqa: E402
import utils  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

VARIANTS = ("vanilla", "rope", "perceiver")
LENGTHS = (128, 256, 512, 1024, 2048, 4096)
TOKENS = 128 * 128  # B·T of every point: the handout's batch of 128 blocks of 128
QUICK = {"lengths": (32, 64), "tokens": 512, "warmup": 1, "steps": 2, "peak_n": 512, "n_head": 4, "n_embd": 64}
SIZES = {"n_layer": 4, "n_head": 8, "n_embd": 256}  # the handout's
MIN_TIMED = 3  # timed steps kept however long a step takes (fewer only when --steps asks for fewer)
CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Point:
    """One measurement: a variant at length T (block_size = T) with `batch` rows, and how to time it."""

    variant: str
    T: int
    batch: int
    precision: str = "fp32"  # "bf16" or "fp32"
    device: str = "cpu"
    warmup: int = 2
    steps: int = 5
    point_budget: float = 60.0  # seconds of warm-up and timed steps aimed at, beyond which fewer run
    n_layer: int = 4
    n_head: int = 8
    n_embd: int = 256
    vocab_size: int = 256
    bottleneck_dim: int = 64
    seed: int = 0

    def config(self) -> GPTConfig:
        """The model's configuration: the handout's sizes, block_size T, no dropout."""
        return GPTConfig(vocab_size=self.vocab_size, block_size=self.T, n_layer=self.n_layer, n_head=self.n_head,
                         n_embd=self.n_embd, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0, variant=self.variant,
                         bottleneck_dim=self.bottleneck_dim)  # fmt: skip


def choose_precision(device: torch.device, fp32: bool = False) -> str:
    """The precision training uses on `device`, "bf16" or "fp32", as measured and cached by machine.choose."""
    return policy.choose(device, fp32, say=False)["precision"]


def autocast(device: torch.device, precision: str):
    """The autocast context training uses for `precision` (a no-op for fp32)."""
    return policy.autocast(device, precision == "bf16")


# ---------------------------------------------------------------------------
# Arithmetic: FLOPs and memory of a point, before running it


def analytic_flops(p: Point) -> float:
    """Forward+backward FLOPs (3 × the forward's, matmuls only) of one step, from the shapes: per position
    12·C² per full block (q, k, v, proj, MLP) and C·V for the head, 2 FLOPs a multiply-add; attention
    4·B·Tq·Tk·C per block, Tq×Tk = T×T for vanilla and rope, m×T in the perceiver's down and up blocks and
    m×m in its middle ones (m = min(bottleneck_dim, T)). Matches FlopCounterMode exactly."""
    B, T, C, L = p.batch, p.T, p.n_embd, p.n_layer
    head = 2 * B * T * C * p.vocab_size
    if p.variant != "perceiver":
        return 3.0 * (L * (2 * B * T * 12 * C * C + 4 * B * T * T * C) + head)
    m = min(p.bottleneck_dim, T)
    down = 2 * B * T * 2 * C * C + 2 * B * m * 10 * C * C + 4 * B * m * T * C  # k, v on T; q, proj, MLP on m
    middle = (L - 2) * (2 * B * m * 12 * C * C + 4 * B * m * m * C)
    up = 2 * B * T * 10 * C * C + 2 * B * m * 2 * C * C + 4 * B * T * m * C  # q, proj, MLP on T; k, v on m
    return 3.0 * (down + middle + up + head)


def counted_flops(p: Point) -> int:
    """Forward+backward FLOPs of one step by torch.utils.flop_counter, on the meta device: the model's own
    code path (the CPU's plain attention), shapes only, nothing computed or allocated."""
    with torch.device("meta"):
        model = GPT(p.config())
        x = torch.randint(1, p.vocab_size, (p.batch, p.T))
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x, x)
        loss.backward()
    return counter.get_total_flops()


def memory_estimate(p: Point) -> float:
    """Bytes a point's process needs at its peak, roughly (it decides skipping, nothing else): about 0.5 GB of
    runtime; per position about 24·C bytes per value byte for each block at full length (the perceiver has
    two) and 16·V for the logits and their gradients; for vanilla and rope the attention probabilities,
    B·n_head·T² values kept per layer plus about three more in the layer being computed, and the T×T causal
    mask buffers (4 bytes each, one per full attention, two in the perceiver) and their bool copies."""
    value = 2 if p.precision == "bf16" else 4
    positions = p.batch * p.T
    full_blocks = 2 if p.variant == "perceiver" else p.n_layer
    total = 0.5e9 + positions * (full_blocks * 24 * p.n_embd * value + 16 * p.vocab_size)
    if p.variant == "perceiver":
        m = min(p.bottleneck_dim, p.T)
        return total + p.batch * p.n_head * m * p.T * value * 5 + 2 * 4 * p.T * p.T
    return total + p.batch * p.n_head * p.T * p.T * value * (p.n_layer + 3) + p.n_layer * 5 * p.T * p.T


def memory_available(device: torch.device) -> int:
    """Bytes of the device's memory: the GPU's, or the machine's physical memory (os.sysconf)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def skip_reason(p: Point, previous: dict | None, max_point_seconds: float, available: float) -> str | None:
    """Why the point should not run, or None: its memory estimate over `available` bytes, or the same variant's
    previous length (its row `previous`) skipped or slower than max_point_seconds."""
    needed = memory_estimate(p)
    if needed > available:
        return f"needs about {needed / 1e9:.1f} GB, this machine has {available / 1e9:.1f} GB to give it"
    if previous is not None and "skipped" in previous:
        return f"T={previous['T']} was skipped"
    if previous is not None and previous["seconds"] > max_point_seconds:
        return f"a step at T={previous['T']} took {previous['seconds']:.1f} s, over --max_point_seconds {max_point_seconds:g}"
    return None


# ---------------------------------------------------------------------------
# Measuring one point


def rss_bytes() -> int:
    """This process's resident memory now (VmRSS), in bytes; 0 where /proc is missing."""
    try:
        return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024
    except (OSError, IndexError):
        return 0


def timed_steps(step: Callable[[], None], warmup: int, steps: int, budget: float) -> list[float]:
    """Seconds of each timed call of `step` after the warm-up. The first warm-up call sets how many run: one
    warm-up instead of `warmup` when all of them would pass `budget` seconds, and as many timed calls as fit
    in it, between min(steps, MIN_TIMED) and `steps`."""
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    if warmup == 0:
        return [first, *timed_steps(step, 0, steps - 1, budget)] if steps > 1 else [first]
    warm = warmup if first * (warmup + steps) <= budget else 1
    for _ in range(warm - 1):
        step()
    timed = max(min(steps, MIN_TIMED), min(steps, int(budget / first) - warm))
    seconds = []
    for _ in range(timed):
        t0 = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t0)
    return seconds


def run_point(p: Point) -> dict:
    """Build the model, a random batch and AdamW for `p`, time its training steps, and measure its memory
    (see the module's docstring); the point's part of a row."""
    device = torch.device(p.device)
    torch.manual_seed(p.seed)
    model = GPT(p.config()).to(device).train()
    x = torch.randint(1, p.vocab_size, (p.batch, p.T), device=device)
    y = torch.randint(1, p.vocab_size, (p.batch, p.T), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, p.precision):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        sync()

    flops = counted_flops(p)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
    else:
        baseline = rss_bytes()
    seconds = timed_steps(step, p.warmup, p.steps, p.point_budget)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        memory = {"peak_allocated_bytes": peak, "baseline_allocated_bytes": baseline}
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        memory = {"peak_rss_bytes": peak, "baseline_rss_bytes": baseline}
    return {"seconds": statistics.median(seconds), "step_seconds": seconds, **memory,
            "step_peak_bytes": max(0, peak - baseline), "flops": flops, "analytic_flops": analytic_flops(p)}  # fmt: skip


def run_point_on_gpu(p: Point) -> dict:
    """run_point in this process (the GPU's own counters give the point's memory); running out of GPU memory
    gives {"skipped": why}."""
    try:
        return run_point(p)
    except torch.cuda.OutOfMemoryError as e:
        return {"skipped": f"out of GPU memory: {str(e).splitlines()[0][:200]}"}
    finally:
        torch.cuda.empty_cache()


def run_point_in_child(p: Point, timeout: float) -> dict:
    """run_point in a fresh process (its peak RSS is the point's own); a process that dies or runs past
    `timeout` seconds gives {"skipped": why}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--point", json.dumps(asdict(p))]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"its process ran past --point_timeout {timeout:g} s and was stopped"}
    return child_result(done, time.perf_counter() - t0)


def child_result(done: subprocess.CompletedProcess, seconds: float) -> dict:
    """The point's measurements from its process's one JSON line, or {"skipped": why} when it failed."""
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    if done.returncode < 0:
        signal = -done.returncode
        hint = " (SIGKILL: out of memory, most likely)" if signal == 9 else ""
        return {"skipped": f"its process was killed by signal {signal}{hint} after {seconds:.0f} s"}
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"skipped": f"its process failed (exit {done.returncode}) after {seconds:.0f} s: {last[:300]}"}


# ---------------------------------------------------------------------------
# The run: machine, peak, every point


def machine(device: torch.device) -> dict:
    """Where the run was made: the CPU (model name, family and model), its precision-relevant flags, the
    device, threads and torch; `label` names it in tables and figures."""
    info = utils.cpu_info()
    flags = set(info.get("flags", "").split())
    cpu = info.get("model name", "unknown CPU")
    found = {flag: flag in flags for flag in CPU_FLAGS}
    if device.type == "cuda":
        label = torch.cuda.get_device_name(device)
    else:
        vector = "AMX" if found["amx_bf16"] else "AVX-512 with bf16" if found["avx512_bf16"] else "AVX-512" if found["avx512f"] else "no AVX-512"  # fmt: skip
        label = f"{cpu}, {vector}, {torch.get_num_threads()} threads"
    return {"label": label, "cpu": cpu, "cpu_family": info.get("cpu family"), "cpu_model": info.get("model"),
            **found, "device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__}  # fmt: skip


def matmul_gflops(n: int, device: torch.device, precision: str) -> float:
    """GFLOP/s of an n×n by n×n matmul in `precision` on `device` (bench_epoch's measurement of the peak)."""
    return bench_epoch.matmul_gflops(n, n, n, torch.bfloat16 if precision == "bf16" else torch.float32, device=device)


def finish(row: dict) -> dict:
    """Add achieved_gflops and predicted_seconds to a measured row (a skipped one stays as it is)."""
    if "skipped" not in row:
        row["achieved_gflops"] = row["flops"] / row["seconds"] / 1e9
        row["predicted_seconds"] = row["flops"] / (row["peak_gflops"] * 1e9)
    return row


def measure(args: argparse.Namespace, record: Callable[[dict], None]) -> list[dict]:
    """Every (variant, T) row, each passed to `record` as soon as it is made."""
    os.environ.setdefault("GIT_OPTIONAL_LOCKS", "0")  # the commit lookup below never takes git's index lock
    device = torch.device(args.device)
    precision = choose_precision(device, args.fp32)
    where = machine(device)
    peak = matmul_gflops(args.peak_n, device, precision)
    common = {"bench": "scaling", "run": time.strftime("%Y-%m-%dT%H:%M:%S"), "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": " ".join(sys.argv), "commit": utils.provenance(device)["commit"], "machine": where,
              "precision": precision, "quick": args.quick, "tokens": args.tokens, "peak_gflops": peak}  # fmt: skip
    available = args.memory_fraction * memory_available(device)
    rows = []
    for variant in args.variants:
        previous = None
        for T in args.lengths:
            p = Point(variant, T, max(1, args.tokens // T), precision, str(device), args.warmup, args.steps,
                      args.point_budget, **{k: getattr(args, k) for k in SIZES}, bottleneck_dim=args.bottleneck_dim)  # fmt: skip
            row = {**common, "variant": variant, "T": T, "batch": p.batch, "bottleneck_dim": args.bottleneck_dim,
                   "sizes": {"n_layer": p.n_layer, "n_head": p.n_head, "n_embd": p.n_embd, "vocab_size": p.vocab_size}}  # fmt: skip
            row["load_average"] = os.getloadavg()[0]  # another process's threads slow a CPU point: this shows it
            reason = skip_reason(p, previous, args.max_point_seconds, available)
            if reason is not None:
                row["skipped"] = reason
            elif device.type == "cuda":
                row |= run_point_on_gpu(p)
            else:
                row |= run_point_in_child(p, args.point_timeout)
            rows.append(finish(row))
            record(row)
            previous = row
    return rows


def gb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| variant | T | batch | step | predicted | GFLOP | GFLOP/s | step memory | note |", "|---" * 9 + "|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['variant']} | {r['T']} | {r['batch']} | - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        lines.append(
            f"| {r['variant']} | {r['T']} | {r['batch']} | {r['seconds']:.3f} s | {r['predicted_seconds']:.3f} s "
            f"| {r['flops'] / 1e9:.1f} | {r['achieved_gflops']:.0f} | {gb(r['step_peak_bytes'])} "
            f"| {len(r['step_seconds'])} timed |"
        )
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--lengths", nargs="+", type=int, default=None, help=f"T values ({' '.join(map(str, LENGTHS))})")
    p.add_argument("--tokens", type=int, default=None, help=f"B·T of every point ({TOKENS}; --quick {QUICK['tokens']})")
    p.add_argument("--bottleneck_dim", type=int, default=64, help="the perceiver's m (64)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (2; 1 where a step is long)")
    p.add_argument("--steps", type=int, default=5, help="timed steps, the median reported (5; fewer where long)")
    p.add_argument("--point_budget", type=float, default=60.0, help="seconds of steps a point aims at (60)")
    p.add_argument("--max_point_seconds", type=float, default=15.0,
                   help="skip a variant's next T once a step took longer than this (15: a 2-core CPU run in ~11 min)")  # fmt: skip
    p.add_argument("--point_timeout", type=float, default=900.0, help="stop a point's process after this (900 s)")
    p.add_argument("--memory_fraction", type=float, default=0.7, help="of the device's memory a point may need")
    p.add_argument("--fp32", action="store_true", help="fp32 even where training would use bf16 autocast")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--peak_n", type=int, default=None, help="side of the square matmul timed for the peak (2048; 8192 on a GPU)"
    )
    for size, value in SIZES.items():
        p.add_argument(f"--{size}", type=int, default=None, help=f"the model's {size} ({value}; --quick: smaller)")
    p.add_argument(
        "--quick", action="store_true", help="T = 32, 64, 512 tokens, n_embd 64, 1 + 2 steps: a check that it runs"
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scaling.jsonl", help="appended to")
    p.add_argument("--no_record", action="store_true", help="print only")
    p.add_argument("--point", default=None, help=argparse.SUPPRESS)  # a child process's point, as JSON
    args = p.parse_args(argv)
    if args.quick:
        args.warmup, args.steps = min(args.warmup, QUICK["warmup"]), min(args.steps, QUICK["steps"])
    args.lengths = args.lengths or list(QUICK["lengths"] if args.quick else LENGTHS)
    args.tokens = args.tokens or (QUICK["tokens"] if args.quick else TOKENS)
    args.peak_n = args.peak_n or (QUICK["peak_n"] if args.quick else 8192 if args.device.startswith("cuda") else 2048)
    for size, value in SIZES.items():
        if getattr(args, size) is None:
            setattr(args, size, QUICK.get(size, value) if args.quick else value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.point is not None:  # a child: one point, one JSON line
        print(json.dumps(run_point(Point(**json.loads(args.point)))), flush=True)
        return 0
    if not args.no_record:
        args.out.parent.mkdir(parents=True, exist_ok=True)

    def record(row: dict) -> None:
        state = f"skipped: {row['skipped']}" if "skipped" in row else f"{row['seconds']:.3f} s"
        print(f"{row['variant']} T={row['T']} B={row['batch']}: {state}", flush=True)
        if not args.no_record:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    rows = measure(args, record)
    print(f"\n{rows[0]['machine']['label']}, {rows[0]['precision']}, peak {rows[0]['peak_gflops']:.0f} GFLOP/s\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
