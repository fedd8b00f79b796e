"""What a pretraining step costs on this machine, and how close it comes to the machine's matmul peak.

    python bench/bench_epoch.py                                  # --preset cpu, every variant, 30 steps
    python bench/bench_epoch.py --preset handout --variants vanilla   # the handout's step (file order, batch 128)
    python bench/bench_epoch.py --preset handout --variants vanilla --paired /tmp/base/src --rounds 3
        # the same step with another checkout's src/ (a `git worktree`), alternating runs: paired_speedup

Per variant, what `run.py pretrain VARIANT wiki.txt --preset P` builds (perceiver m = 64), its steps timed in
parts as Trainer.optimize runs them: forward, backward, optimizer, data (per batch) and other. Model FLOPs by
torch's counter on every micro-batch shape; Muon's Newton–Schulz: 5 rounds × (4·s²·l + 2·s³) per s×l matrix
(not counted in its spectral form). mfu: achieved GFLOP/s over the measured 2048^3 matmul peak in the
precision training uses. Appends one row per variant to --out.
"""

from __future__ import annotations

import copy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import research  # noqa: E402

CPU = torch.device("cpu")
PARTS = ("forward", "backward", "optimizer", "data", "other")
NS_ROUNDS = 5  # optim.orthogonalize's default
FLAGS = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"}  # recorded where the CPU has them


def load_src(src: Path) -> SimpleNamespace:
    """The modules of the src/ folder `src`: this checkout's, or another's of the same public functions (replacing
    those research.py imported)."""
    if src.resolve() != ROOT / "src":
        for name, module in list(sys.modules.items()):
            if Path(getattr(module, "__file__", None) or "/").parent == ROOT / "src":
                del sys.modules[name]
    sys.path.insert(0, str(src))
    import config, dataset, machine, optim, run, trainer, utils  # noqa: E401, I001

    return SimpleNamespace(
        config=config, dataset=dataset, machine=machine, optim=optim, run=run, trainer=trainer, utils=utils
    )


def newton_schulz_flops(optimizer) -> float:
    """FLOPs of one step's Newton–Schulz iterations (see the module's docstring); 0 without Muon."""
    muon = getattr(optimizer, "muon", None)
    if muon is None:
        return 0.0
    rounds = 1 if muon.spectral else NS_ROUNDS
    shapes = [(min(p.shape), max(p.shape)) for group in muon.param_groups for p in group["params"]]
    return float(sum(rounds * (4 * short * short * long + 2 * short**3) for short, long in shapes))


def flops_by_shape(model: torch.nn.Module, autocast: Callable) -> Callable:
    """A function (x, y) -> the FLOPs of forward and backward on a copy of `model`, counted once per shape."""
    model, counted = copy.deepcopy(model), {}

    def flops(x: torch.Tensor, y: torch.Tensor) -> int:
        if x.shape not in counted:
            counted[x.shape] = research.count_flops(model, x, y, autocast)
        return counted[x.shape]

    return flops


def split(src: SimpleNamespace, trainer, x: torch.Tensor, y: torch.Tensor) -> list:
    """The step's micro-batches [(x, y, share)] as trainer.optimize makes them."""
    return src.dataset.micro_batches(x, y, 0 if trainer.config.compile else trainer.config.micro_batch)


def clock_parts(trainer, clock: dict) -> None:
    """Add the seconds of trainer.optimize's forward passes and optimizer steps to `clock`, through torch's hooks on
    the model and the optimizers (the rest of a step is its backward pass and the gradient clipping)."""

    def timer(part: str) -> tuple[Callable, Callable]:
        def start(*_) -> None:
            clock["started"] = time.perf_counter()

        def stop(*_) -> None:
            clock[part] += time.perf_counter() - clock["started"]

        return start, stop

    start, stop = timer("forward")
    trainer.model.register_forward_pre_hook(start)
    trainer.model.register_forward_hook(stop)
    optimizers = (
        [trainer.optimizer.muon, trainer.optimizer.adamw] if hasattr(trainer.optimizer, "muon") else [trainer.optimizer]
    )
    for optimizer in optimizers:
        start, stop = timer("optimizer")
        optimizer.register_step_pre_hook(start)
        optimizer.register_step_post_hook(stop)


def build(src: SimpleNamespace, args, variant: str):
    """The dataset and trainer that `run.py pretrain VARIANT CORPUS --preset P` (and the size flags) builds."""
    typed = {"function": "pretrain", "variant": variant, "pretrain_corpus_path": str(args.corpus),
             "preset": args.preset, "bottleneck_dim": 64, "fp32": args.fp32 or None, "batch_size": args.batch_size,
             "n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd}  # fmt: skip
    run_config = src.config.resolve(typed)
    src.utils.seed_everything(run_config.seed)
    corpus = src.dataset.CharCorruptionDataset(src.dataset.read_text(args.corpus), src.config.BLOCK_SIZE)
    model = src.config.build_model(run_config, corpus.vocab_size)
    chosen = src.machine.choose(CPU, run_config.fp32, args.micro_batch, say=False)
    # run.py's train builds this TrainerConfig too; the schedule's end does not change a step's cost
    cfg = src.trainer.TrainerConfig(
        **{name: getattr(run_config, name) for name in src.run.TRAINER_SETTINGS},
        learning_rate=run_config.pretrain_lr,
        micro_batch=chosen["micro_batch"] if run_config.order == "file" else 0,
        precision=chosen["precision"],
    )
    return corpus, src.trainer.Trainer(model, corpus, cfg, CPU), run_config


def measure_variant(src: SimpleNamespace, args, variant: str) -> dict:
    """Time --warmup then --steps steps of `variant`; returns its results (no peak or machine yet)."""
    corpus, trainer, run_config = build(src, args, variant)
    cfg = trainer.config
    t0 = time.perf_counter()
    epoch = list(trainer.batches(1))  # epoch 0's batches are the ones trained on below
    data_seconds = (time.perf_counter() - t0) / len(epoch)
    epoch_positions = sum(xs.numel() for x, y in epoch for xs, _, _ in split(src, trainer, x, y))
    batches = list(trainer.batches(0))
    batches = (batches * (1 + (args.warmup + args.steps) // len(batches)))[: args.warmup + args.steps]
    flops = flops_by_shape(trainer.model, lambda: src.machine.autocast(trainer.device, cfg.precision))
    trainer.model.train()
    clock = dict.fromkeys(PARTS, 0.0)
    clock_parts(trainer, clock)
    positions = padded = targets = model_flops = 0
    wall = 0.0
    for i, (x, y) in enumerate(batches):
        if i == args.warmup:
            clock |= dict.fromkeys(PARTS, 0.0)
        t0 = time.perf_counter()
        loss = trainer.optimize(x, y)  # at the peak rate throughout: the schedule does not change a step's cost
        optimized = time.perf_counter()
        final_loss = loss.item()
        if i >= args.warmup:
            wall += time.perf_counter() - t0
            clock["backward"] += optimized - t0
            parts = split(src, trainer, x, y)
            positions += sum(xs.numel() for xs, _, _ in parts)
            model_flops += sum(flops(xs, ys) for xs, ys, _ in parts)
            padded, targets = padded + x.numel(), targets + int((y != 0).sum())
    n = args.steps
    clock["backward"] -= clock["forward"] + clock["optimizer"]  # what optimize spent beside those
    seconds = {part: clock[part] / n for part in ("forward", "backward", "optimizer")}
    other = max(0.0, wall / n - sum(seconds.values()))  # what the step's wall time holds beyond those
    seconds |= {"data": data_seconds, "other": other}
    step = sum(seconds.values())
    return {
        "variant": variant,
        "preset": args.preset,
        "order": cfg.order,
        "batch_size": cfg.batch_size,
        "micro_batch": cfg.micro_batch,
        "optimizer": cfg.optimizer,
        "dropout": run_config.dropout,
        "sizes": {"n_layer": run_config.n_layer, "n_head": run_config.n_head, "n_embd": run_config.n_embd},
        "steps": n,
        "warmup": args.warmup,
        "seconds_per_step": step,
        "parts": {part: {"seconds": s, "share": s / step} for part, s in seconds.items()},
        "positions_per_step": positions / n,
        "padded_positions_per_step": padded / n,
        "target_positions_per_step": targets / n,
        "model_gflop_per_step": model_flops / n / 1e9,
        "optimizer_gflop_per_step": newton_schulz_flops(trainer.optimizer) / 1e9,
        "epoch": {
            "batches": len(epoch),
            "positions": epoch_positions,
            "seconds": step / (positions / n) * epoch_positions,
        },
        "final_loss": final_loss,
    }


def machine(src: SimpleNamespace, bf16: bool, peak_n: int) -> dict:
    """The machine's part of a row: its CPU, threads, torch, precision and measured matmul peaks."""
    dtype, other = (torch.bfloat16, torch.float32) if bf16 else (torch.float32, torch.bfloat16)
    info = research.cpu_info()
    probe = src.machine.choose(CPU, say=False)
    return {
        "cpu_name": research.cpu_name(),
        "cpu": {k: info[k] for k in ("model name", "cpu family", "model", "stepping") if k in info},
        "flags": sorted(research.cpu_flags() & FLAGS),
        "threads": torch.get_num_threads(),
        "kernels": src.machine.kernels(),
        "torch": torch.__version__,
        "precision": "bf16" if bf16 else "fp32",
        "peak_gflops": research.matmul_gflops(peak_n, peak_n, peak_n, dtype),
        "other_precision_peak_gflops": research.matmul_gflops(peak_n, peak_n, peak_n, other),
        "shape_gflops": research.matmul_gflops(2048, 256, 1024, dtype),
        "probe": {k: probe[k] for k in ("bf16_gflops", "fp32_gflops") if k in probe},  # one core: machine.choose
    }


def measure(args) -> list[dict]:
    """Every variant's row, with the machine, provenance and achieved/peak figures."""
    src = load_src(args.src)
    common = {"bench": "epoch", **machine(src, src.machine.choose(CPU, args.fp32, say=False)["precision"] == "bf16", args.peak_n),
              "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv),
              "commit": src.utils.provenance(CPU)["commit"], "src": str(args.src)}  # fmt: skip
    rows = []
    for variant in args.variants:
        row = {**common, **measure_variant(src, args, variant)}
        row["achieved_gflops"] = row["model_gflop_per_step"] / row["seconds_per_step"]
        row["mfu"] = row["achieved_gflops"] / row["peak_gflops"]
        rows.append(row)
    return rows


def paired(args, argv: list[str]) -> list[dict]:
    """--rounds runs of this checkout's src/ and of --paired's, alternating, each in its own process; one row
    per variant: this checkout's median run, with both sides' steps and paired_speedup (theirs / ours)."""
    runs: dict[str, list[list[dict]]] = {"ours": [], "theirs": []}
    own = [a for i, a in enumerate(argv) if a not in ("--paired", "--rounds", "--no_record")
           and argv[i - 1 : i] not in (["--paired"], ["--rounds"])]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for who, src in (("theirs", args.paired), ("ours", args.src))[:: 1 if r % 2 else -1]:
                out = Path(tmp) / f"{who}{r}.jsonl"
                subprocess.run([sys.executable, __file__, *own, "--src", str(src), "--out", str(out)], check=True)
                runs[who].append(research.read_jsonl(out))
    rows = []
    for ours, theirs in zip(zip(*runs["ours"]), zip(*runs["theirs"])):  # a variant's rows, one per round
        seconds = {"ours": [r["seconds_per_step"] for r in ours], "theirs": [r["seconds_per_step"] for r in theirs]}
        median = {who: statistics.median(s) for who, s in seconds.items()}
        row = min(ours, key=lambda r: abs(r["seconds_per_step"] - median["ours"]))
        paired_with = {"src": str(args.paired), "commit": theirs[0]["commit"]}
        row = {**row, "command": " ".join(sys.argv), "paired_with": paired_with, "paired_seconds": seconds}
        rows.append(row | {"paired_speedup": median["theirs"] / median["ours"]})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| variant | step | positions | GFLOP/s | peak | MFU | " + " | ".join(PARTS) + " | epoch |",
             "|---" * (7 + len(PARTS)) + "|"]  # fmt: skip
    for r in rows:
        shares = " | ".join(f"{r['parts'][p]['share']:.0%}" for p in PARTS)
        speedup = f" ({r['paired_speedup']:.2f}x the other src)" if "paired_speedup" in r else ""
        lines.append(
            f"| {r['variant']}, {r['preset']} | {r['seconds_per_step']:.3f} s{speedup} | {r['positions_per_step']:,.0f} "
            f"| {r['achieved_gflops']:.0f} | {r['peak_gflops']:.0f} | {r['mfu']:.1%} | {shares} | {r['epoch']['seconds']:.1f} s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = research.benchmark_parser(__doc__, "speed.jsonl")
    p.add_argument("--preset", default="cpu", choices=["cpu", "handout"], help="run.py's preset (cpu)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant (30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "wiki.txt")
    p.add_argument("--batch_size", type=int, default=None, help="as run.py's flag")
    p.add_argument("--micro_batch", type=int, default=None, help="the trainer's micro_batch (0: never split)")
    p.add_argument("--peak_n", type=int, default=2048, help="side of the square matmul timed for the peak")
    p.add_argument("--src", type=Path, default=ROOT / "src", help="the src/ folder to time (another checkout's)")
    p.add_argument("--paired", type=Path, default=None, help="another src/ to alternate with (paired_speedup)")
    p.add_argument("--rounds", type=int, default=3, help="--paired: runs of each")
    args = p.parse_args(argv)
    rows = paired(args, argv) if args.paired else measure(args)
    print(table(rows))
    if not args.no_record:
        research.append_jsonl(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
