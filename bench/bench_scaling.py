"""How a training step's time and memory grow with the sequence length T, for the three variants.

    python bench/bench_scaling.py                          # every variant, T = 128 ... 4096 (about 11 min on 2 cores)
    python bench/bench_scaling.py --variants perceiver --lengths 1024 2048
    python bench/bench_scaling.py --quick --no_record      # T = 32, 64 on a few tokens: a check that it runs
    python bench/plot_scaling.py                           # the figure, bench/results/scaling.png

The handout's model (the perceiver's m = 64) at block_size T, no dropout, on B = 16384 / T random tokens; a
step (forward, backward, fused AdamW) in the precision training would use. Per (variant, T): the median step
seconds; memory (CUDA: peak allocated over the start; CPU: the point's own process's peak RSS over its start);
torch's count of FLOPs and their time at the measured matmul peak (predicted_seconds). Points whose memory
would not fit or after a step over --max_point_seconds are skipped. One row per point is appended to --out, whole.
A flag out of its range, a variant that fits at none of the lengths or an --out that cannot take rows is refused
in one line (exit code 2) before anything is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import research  # noqa: E402

import machine as policy  # noqa: E402
import utils  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from utils import UserError  # noqa: E402

LENGTHS = (128, 256, 512, 1024, 2048, 4096)
TOKENS = 128 * 128  # B·T of every point: the handout's batch of 128 blocks of 128
SIZES = {"n_layer": 4, "n_head": 8, "n_embd": 256}  # the handout's
QUICK = {"lengths": (32, 64), "tokens": 512, "warmup": 1, "steps": 2, "peak_n": 512, "n_head": 4, "n_embd": 64}
MIN_TIMED = 3  # timed steps kept however long a step takes (fewer only when --steps asks for fewer)
CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")
AT_LEAST_ONE = ("tokens", "bottleneck_dim", "warmup", "steps", "n_layer", "n_head", "n_embd", "peak_n")
SECONDS = ("point_budget", "max_point_seconds", "point_timeout")
MAX_PEAK_N = 1 << 16  # an eighth of each side is allocated before any halving: past this, a typo that fills memory
MAX_POINT_TIMEOUT = 86400.0  # a day; the system's wait overflows past about 24 days


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


def counted_flops(p: Point) -> int:
    """Forward+backward FLOPs of one step by torch's flop counter on the meta device (nothing computed)."""
    with torch.device("meta"):
        model = GPT(p.config())
        x = torch.randint(1, p.vocab_size, (p.batch, p.T))
    return research.count_flops(model, x, x)


def parameter_count(p: Point) -> int:
    """The model's parameters, roughly: 12·C² a block, the token table and the head (V·C each), the position
    table (T·C) and the perceiver's bottleneck (m·C)."""
    m = p.bottleneck_dim if p.variant == "perceiver" else 0
    return 12 * p.n_layer * p.n_embd**2 + (2 * p.vocab_size + p.T + m) * p.n_embd


def memory_estimate(p: Point) -> float:
    """Bytes a point's process needs at its peak, roughly (it decides skipping only): 0.5 GB of runtime; the
    parameters, their gradients and AdamW's two moments (16 bytes a parameter); per position 24·C values per
    block at full length (the perceiver has two) and 16·V bytes for the logits; the attention probabilities,
    B·n_head·T² values per layer and three more (the perceiver's: B·n_head·m·T, five times); the T×T causal
    mask buffers (4 bytes each) and their bool copies."""
    value = 2 if p.precision == "bf16" else 4
    positions = p.batch * p.T
    full_blocks = 2 if p.variant == "perceiver" else p.n_layer
    total = 0.5e9 + 16 * parameter_count(p) + positions * (full_blocks * 24 * p.n_embd * value + 16 * p.vocab_size)
    if p.variant == "perceiver":
        m = min(p.bottleneck_dim, p.T)
        return total + p.batch * p.n_head * m * p.T * value * 5 + 2 * 4 * p.T * p.T
    return total + p.batch * p.n_head * p.T * p.T * value * (p.n_layer + 3) + p.n_layer * 5 * p.T * p.T


def memory_available(device: torch.device) -> int:
    """Bytes of the device's memory: the GPU's, or the machine's physical memory (utils.physical_memory)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else utils.physical_memory()


def skip_reason(p: Point, previous: dict | None, max_point_seconds: float, available: float) -> str | None:
    """Why the point should not run (its memory estimate over `available` bytes, or the variant's `previous`
    row skipped or slower than max_point_seconds), or None."""
    needed = memory_estimate(p)
    if needed > available:
        return f"needs about {needed / 1e9:.1f} GB, this machine has {available / 1e9:.1f} GB to give it"
    if previous is not None and "skipped" in previous:
        return f"T={previous['T']} was skipped"
    if previous is not None and previous["seconds"] > max_point_seconds:
        return f"a step at T={previous['T']} took {previous['seconds']:.1f} s, over --max_point_seconds {max_point_seconds:g}"
    return None


def rss_bytes() -> int:
    """This process's resident memory now (VmRSS), in bytes; 0 where /proc is missing."""
    try:
        return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024
    except (OSError, IndexError):
        return 0


def timed_steps(step: Callable[[], None], warmup: int, steps: int, budget: float) -> list[float]:
    """Seconds of each timed call of `step` after the warm-up (the first call at least), whose first call sets
    how many run: one warm-up when `warmup` and `steps` would pass `budget` seconds, and as many timed calls as
    fit in it, between min(steps, MIN_TIMED) and `steps`."""
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
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
    """The point's part of a row: its training steps' seconds, memory and FLOPs (the module's docstring)."""
    device = torch.device(p.device)
    torch.manual_seed(p.seed)
    model = GPT(p.config()).to(device).train()
    x = torch.randint(1, p.vocab_size, (p.batch, p.T), device=device)  # its own targets: the work is the same
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with policy.autocast(device, p.precision):
            _, loss = model(x, x)
        loss.backward()
        optimizer.step()
        research.synchronize(device)

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
            "step_peak_bytes": max(0, peak - baseline), "flops": flops}  # fmt: skip


def run_point_on_gpu(p: Point) -> dict:
    """run_point in this process (the GPU's counters give its memory); out of memory: {"skipped": why}."""
    try:
        return run_point(p)
    except torch.cuda.OutOfMemoryError as e:
        return {"skipped": f"out of GPU memory: {str(e).splitlines()[0][:200]}"}
    finally:
        torch.cuda.empty_cache()


def run_point_in_child(p: Point, timeout: float) -> dict:
    """run_point in a fresh process (its peak RSS is the point's); one that dies or times out: {"skipped": why}."""
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


def machine(device: torch.device) -> dict:
    """Where the run was made: CPU, its bf16-relevant flags, device, threads, torch; `label` names it in figures."""
    info, found = research.cpu_info(), {flag: flag in research.cpu_flags() for flag in CPU_FLAGS}
    cpu = info.get("model name", "unknown CPU")
    vector = "AMX" if found["amx_bf16"] else "AVX-512 with bf16" if found["avx512_bf16"] else "AVX-512" if found["avx512f"] else "no AVX-512"  # fmt: skip
    label = f"{cpu}, {vector}, {torch.get_num_threads()} threads"
    if device.type == "cuda":
        label = torch.cuda.get_device_name(device)
    return {"label": label, "cpu": cpu, "cpu_family": info.get("cpu family"), "cpu_model": info.get("model"),
            **found, "device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__}  # fmt: skip


def point(args: argparse.Namespace, variant: str, T: int, precision: str) -> Point:
    """The point the flags describe for `variant` at length T."""
    return Point(variant, T, max(1, args.tokens // T), precision, str(args.device), args.warmup, args.steps,
                 args.point_budget, **{k: getattr(args, k) for k in SIZES}, bottleneck_dim=args.bottleneck_dim)  # fmt: skip


def measure(args: argparse.Namespace, record: Callable[[dict], None]) -> list[dict]:
    """Every (variant, T) row, each passed to `record` as soon as it is made."""
    os.environ.setdefault("GIT_OPTIONAL_LOCKS", "0")  # the commit lookup below never takes git's index lock
    device = args.device
    precision = policy.choose(device, args.fp32, say=False)["precision"]
    where, n = machine(device), args.peak_n
    peak = research.matmul_gflops(n, n, n, torch.bfloat16 if precision == "bf16" else torch.float32, device)
    common = {"bench": "scaling", "run": time.strftime("%Y-%m-%dT%H:%M:%S"), "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": " ".join(sys.argv), "commit": utils.provenance(device)["commit"], "machine": where,
              "precision": precision, "quick": args.quick, "tokens": args.tokens, "peak_gflops": peak}  # fmt: skip
    available = args.memory_fraction * memory_available(device)
    rows = []
    for variant in args.variants:
        previous = None
        for T in args.lengths:
            p = point(args, variant, T, precision)
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
            if "skipped" not in row:
                row["achieved_gflops"] = row["flops"] / row["seconds"] / 1e9
                row["predicted_seconds"] = row["flops"] / (row["peak_gflops"] * 1e9)
            rows.append(row)
            record(row)
            previous = row
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| variant | T | batch | step | predicted | GFLOP | GFLOP/s | step memory | note |", "|---" * 9 + "|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['variant']} | {r['T']} | {r['batch']} | - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        lines.append(
            f"| {r['variant']} | {r['T']} | {r['batch']} | {r['seconds']:.3f} s | {r['predicted_seconds']:.3f} s "
            f"| {r['flops'] / 1e9:.1f} | {r['achieved_gflops']:.0f} | {r['step_peak_bytes'] / 1e9:.2f} GB "
            f"| {len(r['step_seconds'])} timed |"
        )
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    """The flags; those not given take the full run's values, or --quick's. A usage mistake: one line, exit 2."""
    p = research.benchmark_parser(__doc__, "scaling.jsonl")
    p.error = lambda message: p.exit(2, f"{p.prog}: error: {message} (see --help)\n")  # run.py's one line
    p.add_argument("--lengths", nargs="+", type=int, default=None, help=f"T values ({' '.join(map(str, LENGTHS))})")
    p.add_argument("--tokens", type=int, default=None, help=f"B·T of every point ({TOKENS}; --quick {QUICK['tokens']})")
    p.add_argument("--bottleneck_dim", type=int, default=64, help="the perceiver's m (64)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (2; --quick 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps, their median reported (5; --quick 2)")
    p.add_argument("--point_budget", type=float, default=60.0, help="seconds of steps a point aims at (60)")
    p.add_argument("--max_point_seconds", type=float, default=15.0, help="skip the next T after a slower step (15)")
    p.add_argument("--point_timeout", type=float, default=900.0, help="stop a point's process after this (900 s)")
    p.add_argument("--memory_fraction", type=float, default=0.7, help="of the device's memory a point may need")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda where there is one")
    p.add_argument("--peak_n", type=int, default=None, help="side of the matmul timed for the peak (2048; GPU 8192)")
    p.add_argument("--quick", action="store_true", help="T = 32, 64 on 512 tokens, a smaller model: does it run?")
    p.add_argument("--point", default=None, help=argparse.SUPPRESS)  # a child process's point, as JSON
    args = p.parse_args(argv)
    args.device = policy.pick_device(args.device)  # a UserError for cuda without a GPU
    full = {"lengths": LENGTHS, "tokens": TOKENS, "warmup": 2, "steps": 5, **SIZES}
    full["peak_n"] = 8192 if args.device.type == "cuda" else 2048
    for key, value in (full | QUICK if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def problems(args: argparse.Namespace) -> Iterator[str]:
    """What is wrong with the flags, one line each: each number's range, then the rules that tie them together."""
    for flag in AT_LEAST_ONE:
        if getattr(args, flag) < 1:
            yield f"--{flag} must be at least 1, got {getattr(args, flag)}"
    if min(args.lengths) < 1:
        yield f"--lengths must each be at least 1, got {min(args.lengths)}"
    for flag in SECONDS:
        if not 0 < getattr(args, flag) < math.inf:  # NaN fails the comparison too
            yield f"--{flag} must be a positive number of seconds, got {getattr(args, flag)}"
    if not 0 < args.memory_fraction <= 1:
        yield f"--memory_fraction must be above 0 and at most 1, got {args.memory_fraction}"
    if args.point_timeout > MAX_POINT_TIMEOUT:
        yield f"--point_timeout must be at most {MAX_POINT_TIMEOUT:g} seconds (a day), got {args.point_timeout}"
    if args.peak_n > MAX_PEAK_N:
        yield f"--peak_n must be at most {MAX_PEAK_N}, got {args.peak_n}"
    for flag in ("lengths", "variants"):
        if len(set(getattr(args, flag))) < len(getattr(args, flag)):
            yield f"--{flag} names a value twice: {' '.join(map(str, getattr(args, flag)))}"
    if args.n_embd % args.n_head:  # the rules run.py's check_args applies to the same sizes
        yield f"--n_embd {args.n_embd} must be divisible by --n_head {args.n_head}"
    elif "rope" in args.variants and (args.n_embd // args.n_head) % 2:
        yield f"rope needs an even head size; --n_embd {args.n_embd} / --n_head {args.n_head} is odd"
    if "perceiver" in args.variants and args.n_layer < 2:
        yield "the perceiver needs --n_layer of at least 2 (down and up blocks)"


def fit_problem(args: argparse.Namespace) -> str | None:
    """Why a variant asked for could run at none of --lengths: the memory estimate of its smallest point (in
    bf16 unless --fp32: a lower bound) over what the device gives a point; else None."""
    available = args.memory_fraction * memory_available(args.device)
    for variant in args.variants:
        points = [point(args, variant, T, "fp32" if args.fp32 else "bf16") for T in args.lengths]
        smallest = min(points, key=memory_estimate)
        if (needed := memory_estimate(smallest)) > available:
            return (f"{variant} fits at none of --lengths: T={smallest.T} (batch {smallest.batch}) needs at least "
                    f"{needed / 1e9:.3g} GB, this machine has {available / 1e9:.3g} GB to give it")  # fmt: skip
    return None


def check_rows_file(path: Path, flag: str) -> None:
    """`path` can take rows: utils.check_output_file's rules, and a file there already must be readable and
    writable (rows are added by rewriting it whole, and a read-only file is one its owner protects)."""
    utils.check_output_file(path, flag)
    if os.path.isfile(path) and not os.access(path, os.R_OK | os.W_OK):
        raise UserError(f"{flag} {path}: cannot be read and written (permission denied)")


def check(args: argparse.Namespace) -> None:
    """A one-line UserError for the first problem of the flags, before anything is measured or written."""
    problem = next(problems(args), None) or fit_problem(args)
    if problem is not None:
        raise UserError(problem)
    if not args.no_record:  # an empty --out is the current folder: refused as a folder
        check_rows_file(args.out, "--out")
    args.lengths = sorted(args.lengths)  # a variant's next T is skipped after a slow one: ascending


def append_row(path: Path, row: dict) -> None:
    """Add `row` to the JSON-lines file `path` as one line, atomically: the file is rewritten beside itself and
    renamed over, so that a failed write or an interruption leaves it as it was."""
    with utils.atomic_path(path) as tmp:
        old = path.read_bytes() if path.exists() else b""
        tmp.write_bytes(old + (b"\n" if old and not old.endswith(b"\n") else b"") + (json.dumps(row) + "\n").encode())


def run_child(text: str) -> int:
    """A child process's one point, given as JSON: its measurements as one JSON line."""
    try:
        p = Point(**json.loads(text))
    except (ValueError, TypeError):
        raise UserError(f"--point takes a point as JSON, as the parent process gives it; got {text[:60]!r}") from None
    print(json.dumps(run_point(p)), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """0 once every point is measured; 2 after a one-line error (a flag or --out refused before any measuring,
    or a row that could not be written); 130 when interrupted."""
    recorded = []
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if args.point is not None:
            return run_child(args.point)
        check(args)

        def record(row: dict) -> None:
            state = f"skipped: {row['skipped']}" if "skipped" in row else f"{row['seconds']:.3f} s"
            print(f"{row['variant']} T={row['T']} B={row['batch']}: {state}", flush=True)
            if not args.no_record:
                append_row(args.out, row)
                recorded.append(row)

        rows = measure(args, record)
    except SystemExit as e:  # --help, or a usage mistake said in one line
        return int(e.code or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {len(recorded)} rows recorded, each whole", file=sys.stderr)
        return 130
    print(f"\n{rows[0]['machine']['label']}, {rows[0]['precision']}, peak {rows[0]['peak_gflops']:.0f} GFLOP/s\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
