"""Machine policy, measured on the machine a run is on: the device, the precision and micro-batches (`choose`; torch
calls bf16 "supported" on CPUs that emulate it, several times slower) and a long CPU run's threads (`ThreadChooser`).
Flags override them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from utils import UserError, cpu_info, plural, write_json_atomic


def pick_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda if available, else cpu; 'cuda' without a GPU is a UserError."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but no CUDA GPU is available")
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast (fp32 master weights) for precision "bf16"; a no-op for "fp32"."""
    bf16 = precision == "bf16"
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


# torch.compile's backend; tests use "aot_eager", which generates no code.
COMPILE_BACKEND = "inductor"


def compiled(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` compiled whole for batches of one shape; on CUDA, in CUDA graphs, saving kernel launches."""
    mode = "reduce-overhead" if device.type == "cuda" else None
    return torch.compile(model, mode=mode, fullgraph=True, dynamic=False, backend=COMPILE_BACKEND)


def on_device(batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """The (x, y) batches on `device`, views of one copy (not two transfers a step)."""
    flat = torch.cat([t.reshape(-1) for pair in batches for t in pair])
    flat = flat.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else flat.to(device)
    parts = iter(flat.split([t.numel() for pair in batches for t in pair]))
    return [(next(parts).view(x.shape), next(parts).view(y.shape)) for x, y in batches]


# Precision and micro-batches

WIDTH = 256  # the handout's n_embd: the probe is its MLP
PROBE_ROWS = {"cpu": 1024, "cuda": 16384}  # a GPU needs a whole batch's positions to be busy
PROBE_PARTS = 4  # a handout batch of 128 rows in micro-batches of MICRO_BATCH
MICRO_BATCH = 32
PROBE_SECONDS = 1.0
SPLIT_LIMIT = 1.5  # the split cost below which micro-batches pay


@dataclass(frozen=True)
class Measured:
    """GFLOP/s in each precision, the split cost (the probe's time in PROBE_PARTS parts over its time in one), and
    when and how."""

    bf16_gflops: float
    fp32_gflops: float
    split_cost: float
    date: str
    source: str = "measured"  # or "cached"

    @property
    def micro_batch(self) -> int:
        """Rows per micro-batch of the handout's file order (0: whole batches)."""
        return MICRO_BATCH if self.split_cost < SPLIT_LIMIT else 0


def measure(device: torch.device) -> Measured:
    """Time the probe's forward and backward in fp32, in bf16 and in PROBE_PARTS parts, in turn for PROBE_SECONDS
    (three rounds at least), keeping the best of each (warm-up burdens none); on a CPU, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if device.type == "cpu" else threads)
    g, rows = torch.Generator().manual_seed(0), PROBE_ROWS.get(device.type, PROBE_ROWS["cpu"])
    x, w1, w2 = (
        torch.randn(*s, generator=g).div(s[0] ** 0.5).to(device).requires_grad_()
        for s in ((rows, WIDTH), (WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH))
    )

    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def seconds(precision: str, parts: int) -> float:
        sync()
        t0 = time.perf_counter()
        for part in x.split(rows // parts):
            with autocast(device, precision):
                y = torch.relu(part @ w1) @ w2
            y.float().square().mean().backward()
        sync()
        return time.perf_counter() - t0

    probes = (("fp32", 1), ("bf16", 1), ("fp32", PROBE_PARTS))
    best, start, rounds = [math.inf] * 3, time.perf_counter(), 0
    while rounds < 3 or time.perf_counter() - start < PROBE_SECONDS:
        best = [min(b, seconds(*probe)) for b, probe in zip(best, probes)]
        rounds += 1
    torch.set_num_threads(threads)
    flops = 3 * 2 * 2 * rows * WIDTH * 4 * WIDTH  # two matmuls, forward and backward (twice as much)
    return Measured(flops / best[1] / 1e9, flops / best[0] / 1e9, best[2] / best[0], time.strftime("%Y-%m-%d"))


def kernels() -> str:
    """The kernels torch runs on this CPU, which change what it measures: ATen's capability, oneDNN's and MKL's caps."""
    held = [f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS") if os.environ.get(k)]
    return ", ".join([f"kernels {torch.backends.cpu.get_cpu_capability()}", *held])


def machine_key(device: torch.device) -> str:
    """What a measurement holds for: the CPU, cores, kernels, device and torch."""
    cpu = cpu_info()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu.get("model name")
    parts = [
        name or platform.processor(),
        f"family {cpu.get('cpu family')} model {cpu.get('model')}",
        f"{os.cpu_count()} cores",
        kernels(),
        f"torch {torch.__version__}",
    ]
    return f"{device.type}: " + ", ".join(parts)


def cache_path() -> Path | None:
    """$XDG_CACHE_HOME/birthplace-gpt/machine.json (~/.cache when unset or relative); None without an absolute home."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")  # "~" itself when no home can be found
        if not os.path.isabs(home) or home == "/":
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "birthplace-gpt" / "machine.json"


def cached_entry(entry: object) -> Measured | None:
    """A cache entry as a Measured, or None unless its date is a string, its GFLOP/s in (0, 1e6] and its split cost
    in (0, 1e3]."""
    if not isinstance(entry, dict) or not isinstance(entry.get("date"), str):
        return None
    rates = [entry.get(k) for k in ("bf16_gflops", "fp32_gflops", "split_cost")]
    if not all(type(r) in (int, float) and 0 < r <= (1e3 if i == 2 else 1e6) for i, r in enumerate(rates)):
        return None  # NaN fails both comparisons
    return Measured(*map(float, rates), entry["date"], source="cached")


_decided: dict[str, Measured] = {}  # this process's, by machine key


def measured(device: torch.device) -> Measured:
    """This machine's measurement: this process's, the cache's, or measured now and cached (a damaged or unusable
    cache only costs a second)."""
    key = machine_key(device)
    if key in _decided:
        return _decided[key]
    path, cache = cache_path(), None
    usable = path is not None and (not os.path.lexists(path) or (path.is_file() and not path.is_symlink()))
    if usable and path.is_file():
        with contextlib.suppress(OSError, ValueError):
            cache = json.loads(path.read_text(encoding="utf-8"))
    cache = cache if isinstance(cache, dict) else {}
    found = cached_entry(cache.get(key))
    if found is None:
        found = measure(device)
        if usable:
            with contextlib.suppress(OSError, UserError):
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(path, {**cache, key: {k: v for k, v in asdict(found).items() if k != "source"}})
        else:
            where = f"{path} is not a regular file" if path else "no home folder holds it"
            print(f"note: this machine's measurement is not cached ({where})")
    _decided[key] = found
    return found


def choose(device: torch.device, fp32: bool = False, micro_batch: int | None = None, say: bool = True) -> dict:
    """What training on `device` uses, for the params sidecar: the faster precision (`fp32` forces fp32), both rates
    and the micro-batch rows (`micro_batch` overrides). `say` prints it."""
    m = measured(device)
    chosen = "bf16" if m.bf16_gflops > m.fp32_gflops and not fp32 else "fp32"
    why = "--fp32" if fp32 else "bf16 is emulated here" if chosen == "fp32" else "faster here"
    rows = m.micro_batch if micro_batch is None else micro_batch
    if say:
        print(
            f"precision: {chosen} ({why}: bf16 {m.bf16_gflops:.0f} against fp32 {m.fp32_gflops:.0f} GFLOP/s a core, "
            f"{m.source} {m.date}); micro-batches of the file order: {rows or 'none'}"
        )
    return {
        "precision": chosen,
        "bf16_gflops": round(m.bf16_gflops, 1),
        "fp32_gflops": round(m.fp32_gflops, 1),
        "micro_batch": rows,
    }


# Threads, chosen while a long CPU run trains (bench/RESEARCH.md)

TRY_STEPS = 6  # steps timed on the other count in a try
TRY_EVERY = 30.0  # training seconds between tries; doubled after each lost try, up to
TRY_EVERY_MAX = 120.0  # ... this; back to TRY_EVERY once steps take SLOWDOWN times as long
SLOWDOWN = 1.3
SWITCH_MARGIN = 1.1  # how much faster the other count must be: noise does not flip the choice


class ThreadChooser:
    """Keeps torch's CPU thread count at the faster of `threads` and half of it (a process holding a core makes a
    step spread over every core wait): every TRY_EVERY seconds, or when steps slow, TRY_STEPS steps on the other
    count against the latest of the same size, and the faster by their median ratio."""

    def __init__(self, threads: int):
        self.counts = (threads, max(1, threads // 2))
        self.home = threads  # the count in use between tries
        self.latest: dict[int, float] = {}  # seconds of the latest home step, by size
        self.confirmed: dict[int, float] = {}  # the same when the home count last won
        self.try_ratios: list[float] = []  # this try's steps against `latest`
        self.pace_ratios: list[float] = []  # the latest home steps against `confirmed`
        self.tried_steps = 0
        self.interval = self.next_try = TRY_EVERY
        self.warming = False  # the first step after a change is not timed: it starts the threads
        self.switches = 0

    def after_step(self, seconds: float, tokens: int, now: float) -> str | None:
        """Take a step's seconds, size and training time so far; a line to print if the choice changes."""
        if self.warming:
            self.warming = False
            return None
        if torch.get_num_threads() != self.home:  # a try
            self.tried_steps += 1
            if tokens in self.latest:
                self.try_ratios.append(seconds / self.latest[tokens])
            if len(self.try_ratios) >= TRY_STEPS or self.tried_steps >= 4 * TRY_STEPS:
                return self.decide(float(np.median(self.try_ratios)) if self.try_ratios else 1.0, now)
            return None
        if tokens in self.confirmed:
            self.pace_ratios = [*self.pace_ratios[1 - TRY_STEPS :], seconds / self.confirmed[tokens]]
            if len(self.pace_ratios) == TRY_STEPS and np.median(self.pace_ratios) > SLOWDOWN:
                self.interval, self.next_try = TRY_EVERY, now
        self.latest[tokens] = seconds
        if now >= self.next_try:
            self.try_ratios, self.tried_steps = [], 0
            torch.set_num_threads(self.counts[1] if self.home == self.counts[0] else self.counts[0])
            self.warming = True
        return None

    def decide(self, ratio: float, now: float) -> str | None:
        """Keep the faster count after a try whose steps took `ratio` times the home count's."""
        tried, line = torch.get_num_threads(), None
        if ratio * SWITCH_MARGIN < 1.0:
            line = f"training on {plural(tried, 'thread')} instead of {self.home}: {1 / ratio:.1f}x as fast now"
            self.home, self.latest, self.interval = tried, {}, TRY_EVERY
            self.switches += 1
        else:
            torch.set_num_threads(self.home)
            self.warming, self.interval = True, min(2 * self.interval, TRY_EVERY_MAX)
        self.confirmed, self.pace_ratios = dict(self.latest), []
        self.next_try = now + self.interval
        return line
