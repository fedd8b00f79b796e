"""The course's numbers on a CUDA GPU in one call: a speed check, then the handout's recipe for every variant.

    python bench/gpu_check.py                       # speed check, tests/test_cuda.py, the 3 variants (seed 0)
    python bench/gpu_check.py --seeds 0 1 --skip_tests --skip_speed   # two seeds, in another call
    GPU_CHECK_TINY=1 python bench/gpu_check.py      # a rehearsal on any machine, CPU included

1. Alone, one process at a time: vanilla's and rope's pretraining step, the course's loop (bench/course.py)
   against the project's eager and compiled (--compile) step, beside the matmul peak measured in the same call
   (bench/bench_speed.py --compile, in <workdir>). Pretrainings take --compile where it was faster (--compile).
2. `pytest tests/test_cuda.py` and, side by side, the handout's pretrain -> finetune -> evaluate (dev, test)
   per variant and seed (650 epochs, batch 128; perceiver --bottleneck_dim 64), then, while the deadline
   allows, a recite reader and its answers. The highest seeds stop while the rest would miss the deadline.
3. One JSON line per finished run and protocol in --results (bench/results/gpu.jsonl): GPU, torch, each step's
   seconds, ms per pretraining step and its MFU (the handout's FLOPs over the step's time and the peak), the
   speed check and the dev accuracy; then a table beside the published figures.

The tiny mode (2 + 1 epochs, 20 dev and test lines, 1-2 timed steps) rehearses it; rows only to --results.
Without a GPU only the tiny mode runs. At --deadline_minutes every run, the speed check and the tests still going
are stopped (run.py checkpoints) and the table printed. A flag out of its range or a path that cannot be used is
refused in one line, exit code 2, before anything starts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))  # research.py

import bench_speed  # noqa: E402
from bench_scaling import append_row, check_rows_file  # noqa: E402  (JSON-lines rows, each added whole)
from research import LoggedEpochs, accuracy, machine_name, predictions_sidecar, tensorboard_prefix  # noqa: E402

import attention  # noqa: E402
import machine as machine_policy  # noqa: E402
import utils  # noqa: E402
from utils import UserError  # noqa: E402

RUN_PY = str(ROOT / "src" / "run.py")
DATA = ROOT / "data"
VARIANT_FLAGS = {
    "vanilla": [],
    "perceiver": ["--bottleneck_dim", "64"],  # the 2023 handout's perceiver commands
    "rope": [],
}
# Dev accuracy the course published for the handout's recipe (2023 handout: vanilla, perceiver).
PUBLISHED = {"vanilla": 0.214, "perceiver": 0.170}
SPEED_VARIANTS = ("vanilla", "rope")  # the speed check's: one of each handout
HANDOUT_EPOCHS = 650
AFTER_PRETRAIN_SECONDS = 45  # finetune (10 epochs) and two evaluations, as a margin for the plan
RECITE_SECONDS = 60  # reader (recite 2,000 people, finetune 10 epochs) and two reciting evaluations
DEV_PREDICTIONS = {"evaluate": "dev.predictions", "recite_dev": "recite_dev.predictions"}  # a protocol's dev answers
DATA_FILES = ("wiki.txt", "birth_places_train.tsv", "birth_dev.tsv", "birth_test_inputs.tsv")  # in DATA
MAX_DEADLINE_MINUTES = 7 * 24 * 60.0  # a week: the check takes minutes, and the system's waits overflow past weeks
POLL_SECONDS = 2.0  # how often the runs are looked at
KILL_AFTER = 60.0  # seconds past the deadline a run that has not stopped on SIGTERM is given


class Slots:
    """How many runs go at once (all on a GPU, one on a CPU, where they slow each other) and their threads."""

    def __init__(self, runs: int):
        self.parallel = runs if torch.cuda.is_available() else 1
        self.semaphore = threading.Semaphore(self.parallel)
        self.threads = max(1, (os.cpu_count() or 1) // self.parallel)


class Run:
    """One variant and seed: its pipeline runs in a thread, one command after another."""

    def __init__(self, variant: str, seed: int, folder: Path, tiny: bool, data: dict[str, str], slots: Slots,
                 on_result: Callable[[Run, str], None], recite_until: float | None = None,
                 training_flags: list[str] | None = None, pretrain_flags: list[str] | None = None):  # fmt: skip
        self.variant, self.seed, self.folder, self.slots, self.on_result = variant, seed, folder, slots, on_result
        self.recite_until = recite_until  # the recite steps start only before this time (None: never)
        self.name = f"{variant}_seed{seed}"
        self.stopped: str | None = None  # why, once stopped
        self.failed: str | None = None
        self.seconds: dict[str, float] = {}
        self.found: dict[str, dict] = {}  # what the dev evaluations found (their predictions' sidecars), by step
        self.proc: subprocess.Popen | None = None
        self.logged_epochs: LoggedEpochs | None = None  # the pretraining's epochs done, from its TensorBoard log
        self.epoch_times: list[tuple[int, float]] = []  # (epochs done, when first seen)
        common = [variant, "wiki.txt", *VARIANT_FLAGS[variant], "--seed", str(seed)]
        questions = ["--finetune_corpus_path", "birth_places_train.tsv", *(["--max_epochs", "1"] if tiny else [])]
        pretrain = ["--max_epochs", "2"] if tiny else []

        def answer(params: str, split: str, out: str) -> list[str]:
            return ["evaluate", *common, "--reading_params_path", params, "--eval_corpus_path", data[split],
                    "--outputs_path", out]  # fmt: skip

        self.commands = {
            "pretrain": ["pretrain", *common, "--writing_params_path", "pretrain.params", *pretrain,
                         *(training_flags or []), *(pretrain_flags or [])],
            "finetune": ["finetune", *common, "--reading_params_path", "pretrain.params", "--writing_params_path",
                         "finetune.params", *questions, *(training_flags or [])],
            "evaluate": answer("finetune.params", "dev", "dev.predictions"),
            "evaluate_test": answer("finetune.params", "test", "test.predictions"),
            # the recite protocol: a reader finetuned from the same pretrained params on recitations
            "reader": ["finetune", *common, "--reading_params_path", "pretrain.params", "--writing_params_path",
                       "reader.params", *questions, "--recite", *(training_flags or [])],
            "recite_dev": answer("reader.params", "dev", "recite_dev.predictions"),
            "recite_test": answer("reader.params", "test", "recite_test.predictions"),
        }  # fmt: skip
        self.tensorboard_prefix = tensorboard_prefix(self.commands["pretrain"])  # its log's folder name, dated
        self.thread = threading.Thread(target=self.pipeline, daemon=True)

    def pipeline(self) -> None:
        with self.slots.semaphore:
            self.run_commands()

    def run_commands(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(self.slots.threads), "PYTHONUNBUFFERED": "1"}
        for step, argv in self.commands.items():
            if self.stopped:
                return
            if step == "reader" and (self.recite_until is None or time.time() > self.recite_until):
                return  # the direct protocol's figures come first; recite only where time is left
            t0 = time.time()
            if step == "pretrain":  # run.py logs to <folder>/expt/pretrain/<prefix>_<time stamp>
                self.logged_epochs = LoggedEpochs(self.folder / "expt" / "pretrain", self.tensorboard_prefix, t0)
            with open(self.folder / f"{step}.log", "w") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, RUN_PY, *argv], cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, env=env
                )
                if self.stopped:  # stop() came between the check above and the start: it saw no process
                    self.proc.send_signal(signal.SIGTERM)
                code = self.proc.wait()
            self.seconds[step] = round(time.time() - t0, 1)
            if code != 0:
                if not self.stopped:
                    self.failed = f"{step} exited with code {code}; see {self.folder / f'{step}.log'}"
                return
            if step in DEV_PREDICTIONS:  # a row as soon as a protocol has its dev figure
                self.found[step] = predictions_sidecar(self.folder / DEV_PREDICTIONS[step])
                self.on_result(self, "direct" if step == "evaluate" else "recite")

    def observe(self) -> None:
        """Note when the pretraining's epochs done (read from its TensorBoard log) last changed."""
        done = HANDOUT_EPOCHS if "pretrain" in self.seconds else self.logged_epochs() if self.logged_epochs else 0
        if not self.epoch_times or self.epoch_times[-1][0] != done:
            self.epoch_times.append((done, time.time()))

    def pace(self, since: float = 0.0) -> float | None:
        """Seconds per epoch over the epochs finished after `since` (a time), or None if too few."""
        seen = [(n, t) for n, t in self.epoch_times if n > 0 and t >= since]
        if len(seen) < 2 or seen[-1][0] - seen[0][0] < 3:
            return None
        return (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0])

    def stop(self, why: str) -> None:
        self.stopped = why
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # run.py checkpoints and exits

    def kill(self) -> None:
        """End the command now: it did not stop on SIGTERM."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def accuracy(self, step: str = "evaluate") -> tuple[int, int] | None:
        """(correct, total) on dev, once evaluated (step "recite_dev": by the recite protocol)."""
        found = self.found.get(step, {})
        return (found["correct"], found["with_places"]) if accuracy(found) is not None else None


def machine(device: torch.device) -> dict:
    """The GPU (or CPU) and software a row was measured with, and the precision run.py measures and trains in."""
    chosen = machine_policy.choose(device, say=False)
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "device": device.type, "gpu" if device.type == "cuda" else "cpu": machine_name(device),
            "precision": chosen["precision"], "precision_gflops": {k: chosen[k] for k in ("bf16_gflops", "fp32_gflops")}}  # fmt: skip
    if device.type == "cuda":
        info["attention_kernel"] = ",".join(k.name for k in attention.CUDA_ATTENTION_KERNELS)
    return info


def projected_end(run: Run, since: float) -> float | None:
    """When `run` should finish everything, at its pace since `since`; None until that can be told."""
    pace = run.pace(since)
    if pace is None:
        return None
    done, when = run.epoch_times[-1]
    return when + (HANDOUT_EPOCHS - done) * pace + AFTER_PRETRAIN_SECONDS


def supervise(runs: list[Run], deadline: float, tiny: bool) -> None:
    """Wait for every run; once their paces are known, stop the highest seed's runs while the rest would
    finish past the deadline (the others then run faster); at the deadline, stop every run still going."""
    since, decided = time.time(), tiny  # the tiny rehearsal has nothing to plan
    while any(r.thread.is_alive() for r in runs):
        time.sleep(POLL_SECONDS)
        if time.time() >= deadline:
            for r in runs:
                if r.thread.is_alive() and not r.stopped:
                    r.stop("stopped at the deadline")
                if time.time() >= deadline + KILL_AFTER:
                    r.kill()
            continue
        live = [r for r in runs if r.thread.is_alive() and not r.stopped]
        for r in live:
            r.observe()
        ends = [projected_end(r, since) for r in live if "pretrain" not in r.seconds]
        if decided or not ends or None in ends:
            continue
        seeds, fits = sorted({r.seed for r in live}), max(ends) <= deadline
        decided = fits or len(seeds) == 1
        verdict = "inside" if fits else "past" + ("" if decided else f" (stopping seed {seeds[-1]})")
        print(f"plan: {len(live)} runs end in about {(max(ends) - time.time()) / 60:.1f} min at their paces, "
              f"{verdict} the deadline ({(deadline - time.time()) / 60:.1f} min left)", flush=True)  # fmt: skip
        for r in live if not decided else []:
            if r.seed == seeds[-1]:
                r.stop("stopped to fit the deadline")
        since = time.time()


class Results:
    """Finished runs, one JSON line each as each ends (a run cut short by the device's limit loses nothing)."""

    def __init__(self, path: Path | None, info: dict, tiny: bool, tests: subprocess.Popen | None, speed: dict,
                 gflop: dict[str, float]):  # fmt: skip
        self.path, self.info, self.tiny, self.tests = path, info, tiny, tests
        self.speed, self.gflop = speed, gflop  # the speed check's figures; the handout's GFLOP a step by variant
        self.lock = threading.Lock()
        self.unwritten = 0  # rows a failed write lost (a full disk): said at once, and in the exit code

    def tests_passed(self) -> bool | None:
        """True or False once tests/test_cuda.py has finished; None while it runs, if skipped or stopped at the
        deadline."""
        code = None if self.tests is None else self.tests.poll()
        return None if code in (None, -signal.SIGTERM) else code == 0

    def append(self, r: Run, protocol: str) -> None:
        """One row for run r's dev figure by `protocol` ("direct" or "recite")."""
        acc = r.accuracy("evaluate" if protocol == "direct" else "recite_dev")
        if acc is None or self.path is None:
            return
        steps = (
            ("finetune", "evaluate", "evaluate_test")
            if protocol == "direct"
            else ("reader", "recite_dev", "recite_test")
        )
        name = f"{r.variant}_{self.info['device']}_handout_seed{r.seed}" + ("_recite" if protocol == "recite" else "")
        row = {
            "name": name + ("_tiny" if self.tiny else ""), "protocol": protocol,
            "date": datetime.date.today().isoformat(), "variant": r.variant, "recipe": "handout", "seed": r.seed,
            **self.info, "pretrain_epochs": 2 if self.tiny else HANDOUT_EPOCHS,
            "runs_sharing_device": r.slots.parallel, "pretrain_seconds": r.seconds["pretrain"],
            "finetune_seconds": r.seconds["finetune"], "evaluate_seconds": r.seconds["evaluate"],
            "dev_correct": acc[0], "dev_total": acc[1], "dev_accuracy": acc[0] / acc[1],
            "tests_cuda_passed": self.tests_passed(), **trainer_settings(r.folder / "pretrain.params.json"),
            "speed_check": self.speed,
            "commands": [" ".join(["python src/run.py", *r.commands[s]]) for s in ("pretrain", *steps)],
        }  # fmt: skip
        if "ms_per_step" in row:
            row["handout_mfu"] = self.gflop[r.variant] / row["ms_per_step"] * 1e3 / self.speed["peak_gflops"]
        if protocol == "recite":
            row["place_in_recitation"] = r.found["recite_dev"].get("place_in_recitation")
            row["extra_minutes"] = round(sum(r.seconds[s] for s in ("reader", "recite_dev")) / 60, 2)
            row["reader_seconds"] = r.seconds["reader"]
        with self.lock:
            try:
                append_row(self.path, row)
            except UserError as e:  # in a run's thread: said in one line, the other runs go on
                self.unwritten += 1
                print(f"error: {e}", file=sys.stderr, flush=True)


def trainer_settings(sidecar: Path) -> dict:
    """How the pretraining batched its examples, which parameters it decayed, whether it was compiled, and its
    milliseconds a step, from run.py's params sidecar."""
    record = json.loads(sidecar.read_text())
    config, steps = record["config"], record.get("steps")
    found = {"order": config["order"], "decay": config["decay"], "compiled": config.get("compile", False)}
    return found | ({"ms_per_step": record["train_seconds"] / steps * 1e3} if steps else {})


def print_table(runs: list[Run]) -> None:
    print("\n| variant | seed | minutes: pretrain, finetune, reader | dev, direct | published | place in recitation "
          "| dev, recite |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for r in runs:
        direct, recite = (r.accuracy(s) for s in ("evaluate", "recite_dev"))
        shown = [f"{a[0] / a[1]:.1%} ({a[0]}/{a[1]})" if a else "-" for a in (direct, recite)]
        minutes = ", ".join(
            f"{r.seconds[s] / 60:.1f}" if s in r.seconds else "-" for s in ("pretrain", "finetune", "reader")
        )
        ceiling = f"{r.found['recite_dev'].get('place_in_recitation'):.1%}" if recite else "-"
        print(f"| {r.variant} | {r.seed} | {minutes} | {shown[0] if direct else r.stopped or r.failed or 'not finished'} "
              f"| {f'{PUBLISHED[r.variant]:.1%}' if r.variant in PUBLISHED else '-'} | {ceiling} | {shown[1]} |", flush=True)  # fmt: skip


def speed_check(workdir: Path, tiny: bool, device: torch.device, deadline: float) -> dict:
    """bench_speed.py's pretraining step for vanilla and rope, alone: {variant: {"reference", "eager",
    "compiled": ms a step}, "handout_mfu": {...}, "peak_gflops", "compile_pays"}; {} if it failed (see speed.log)
    or was stopped at the deadline."""
    steps = ["--ref_steps", "1", "--fast_steps", "2"] if tiny else ["--ref_steps", "10", "--fast_steps", "40"]
    argv = [sys.executable, str(ROOT / "bench" / "bench_speed.py"), "--parts", "train", "--variants", *SPEED_VARIANTS,
            "--compile", "--device", device.type, *steps, "--out", str(workdir / "speed.json"),
            "--jsonl", str(workdir / "speed.jsonl")]  # fmt: skip
    t0 = time.time()
    try:
        with open(workdir / "speed.log", "w") as log:
            code = subprocess.call(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=deadline - t0)
    except subprocess.TimeoutExpired:  # call() has killed it
        print(f"speed check ({time.time() - t0:.0f} s): stopped at the deadline", flush=True)
        return {}
    if code != 0:
        print(f"speed check ({time.time() - t0:.0f} s): exit {code}; see {workdir / 'speed.log'}", flush=True)
        return {}
    found = json.loads((workdir / "speed.json").read_text())
    rows = found["train"] + found.get("train_fast_compiled", [])
    key = {("reference", False): "reference", ("fast", False): "eager", ("fast", True): "compiled"}
    speed: dict = {"peak_gflops": max(r["peak_gflops"] for r in rows), "handout_mfu": {}}
    for r in rows:
        name = key[r["impl"], r["compiled"]]
        speed.setdefault(r["variant"], {})[name] = round(r["seconds_per_step"] * 1e3, 2)
        speed["handout_mfu"].setdefault(r["variant"], {})[name] = round(r["handout_mfu"], 4)
    speed["compile_pays"] = all(speed[v].get("compiled", float("inf")) < speed[v]["eager"] for v in SPEED_VARIANTS)
    print(f"speed check ({time.time() - t0:.0f} s), ms a step (reference, eager, compiled):", ", ".join(
        f"{v} {speed[v]['reference']}, {speed[v]['eager']}, {speed[v].get('compiled', 'failed')}" for v in SPEED_VARIANTS), flush=True)  # fmt: skip
    return speed


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The flags; a usage mistake is said in one line, exit code 2."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: p.exit(2, f"{p.prog}: error: {message} (see --help)\n")  # one line, as run.py's
    p.add_argument("--variants", nargs="+", default=list(VARIANT_FLAGS), choices=list(VARIANT_FLAGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="the highest stopped first if they do not fit")
    p.add_argument("--deadline_minutes", type=float, default=8.5, help="when every run should be done")
    p.add_argument("--workdir", default=str(ROOT / "bench" / "runs" / "gpu_check"))
    p.add_argument("--results", default=None, help="JSONL to append to (bench/results/gpu.jsonl)")
    p.add_argument("--tiny", action="store_true", default=os.environ.get("GPU_CHECK_TINY") == "1",
                   help="a rehearsal in minutes, on any machine (GPU_CHECK_TINY=1 sets it)")  # fmt: skip
    p.add_argument("--skip_tests", action="store_true", help="do not run tests/test_cuda.py")
    p.add_argument("--skip_speed", action="store_true", help="no speed check (the peak is still measured)")
    p.add_argument("--compile", choices=["measured", "yes", "no"], default="measured",
                   help="pretrain with --compile: where the speed check found it faster (default), always, never")  # fmt: skip
    p.add_argument("--fp32", action="store_true", help="train in fp32 (run.py --fp32)")
    p.add_argument("--no_recite", action="store_true", help="the direct protocol only (no reader)")
    args = p.parse_args(argv)
    if args.results is None and not args.tiny:
        args.results = str(ROOT / "bench" / "results" / "gpu.jsonl")
    return args


def check(args: argparse.Namespace) -> None:
    """A one-line UserError for the first problem of the flags, the paths or the machine, before anything starts."""
    if os.environ.get("GPU_CHECK_TINY", "") not in ("", "0", "1"):
        raise UserError(f"GPU_CHECK_TINY must be 1 (the tiny rehearsal) or 0, got {os.environ['GPU_CHECK_TINY']!r}")
    if not 0 < args.deadline_minutes <= MAX_DEADLINE_MINUTES:  # NaN fails the comparison too
        raise UserError(f"--deadline_minutes must be above 0 and at most {MAX_DEADLINE_MINUTES:g} (a week), "
                        f"got {args.deadline_minutes}")  # fmt: skip
    if bad := [s for s in args.seeds if not 0 <= s < 2**32]:
        raise UserError(f"--seeds must be 0..{2**32 - 1}, as run.py's --seed, got {bad[0]}")
    for flag in ("seeds", "variants"):  # a run's folder is named by its variant and seed
        if len(set(getattr(args, flag))) < len(getattr(args, flag)):
            raise UserError(f"--{flag} names a value twice: {' '.join(map(str, getattr(args, flag)))}")
    utils.check_path_given(args.workdir, "--workdir")
    utils.check_output_dir(args.workdir, "--workdir")
    if args.results is not None:
        utils.check_path_given(args.results, "--results")
        check_rows_file(Path(args.results), "--results")
    for name in DATA_FILES:
        utils.check_input(DATA / name, "", " (run the data step: python data/get_data.py)")
    if not args.tiny and not torch.cuda.is_available():
        raise UserError("no CUDA GPU here: the handout's 650 epochs a run would take days on a CPU; "
                        "rehearse with --tiny (or GPU_CHECK_TINY=1), minutes on any machine")  # fmt: skip


def finish_tests(tests: subprocess.Popen, deadline: float) -> None:
    """Wait for tests/test_cuda.py until the deadline, then stop it (its verdict: not finished)."""
    try:
        tests.wait(timeout=max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        tests.terminate()
        tests.wait()


def run_check(args: argparse.Namespace, start: float) -> int:
    """The speed check, the tests and the runs (the module's docstring), until done or the deadline; the table.
    0 when every run finished or was stopped and the tests did not fail, else 1."""
    deadline = start + args.deadline_minutes * 60
    workdir, results_path = Path(args.workdir), Path(args.results) if args.results else None
    workdir.mkdir(parents=True, exist_ok=True)
    data = {"dev": "birth_dev.tsv", "test": "birth_test_inputs.tsv"}
    for key, name in data.items() if args.tiny else ():  # the first 20 lines
        lines = (DATA / name).read_text(encoding="utf-8").splitlines(keepends=True)[:20]
        (workdir / f"{key}20.tsv").write_text("".join(lines), encoding="utf-8")
        data[key] = str(workdir / f"{key}20.tsv")
    device = machine_policy.pick_device("auto")
    info = machine(device) | ({"precision": "fp32"} if args.fp32 else {})
    print(f"gpu_check on {info.get('gpu', info.get('cpu'))}, torch {info['torch']}, CUDA {info['cuda']}", flush=True)
    speed = {} if args.skip_speed else speed_check(workdir, args.tiny, device, deadline)
    speed.setdefault("peak_gflops", bench_speed.peak_gflops(device, info["precision"] == "bf16"))
    vocab_size = bench_speed.CharCorruptionDataset(bench_speed.read_text(DATA / "wiki.txt"), 128).vocab_size
    gflop = {v: bench_speed.handout_step_gflop(v, vocab_size, 128, device) for v in VARIANT_FLAGS}
    compiled = args.compile == "yes" or (args.compile == "measured" and speed.get("compile_pays", False))
    print(f"pretrainings {'with' if compiled else 'without'} --compile ({args.compile}); matmul peak "
          f"{speed['peak_gflops']:,.0f} GFLOP/s", flush=True)  # fmt: skip
    tests = None
    if not args.skip_tests:
        with open(workdir / "test_cuda.log", "w") as log:  # the child keeps its own handle
            tests = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_cuda.py"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
    results = Results(results_path, info, args.tiny, tests, speed, gflop)
    pairs = [(v, s) for s in args.seeds for v in args.variants]
    slots = Slots(len(pairs))
    recite_until = None if args.no_recite else deadline - RECITE_SECONDS
    flags = ["--fp32"] if args.fp32 else []
    runs = [Run(v, s, workdir / f"{v}_seed{s}", args.tiny, data, slots, results.append, recite_until, flags,
                ["--compile"] * compiled) for v, s in pairs]  # fmt: skip
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout` around this script: report what finished
    try:
        for r in runs:
            r.thread.start()
        supervise(runs, deadline, args.tiny)
        if tests is not None:
            finish_tests(tests, deadline)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the report short
        print("interrupted: stopping the runs still going", flush=True)
        for r in runs:
            r.stop("stopped: the script was interrupted")
        if tests is not None and tests.poll() is None:
            tests.terminate()
    passed = results.tests_passed()
    if tests is not None:
        summary = (workdir / "test_cuda.log").read_text(errors="replace").strip().splitlines()
        verdict = {True: "passed", False: "FAILED", None: "not finished"}[passed]
        print(f"tests/test_cuda.py: {verdict} ({summary[-1] if summary else ''})")
    print_table(runs)
    print(f"\nwall clock {(time.time() - start) / 60:.1f} min; rows appended to {results_path}")
    finished = all(r.accuracy() or r.stopped for r in runs) and passed is not False
    return 0 if finished and not results.unwritten else 1


def main(argv: list[str] | None = None) -> int:
    """run_check's exit code; 2 after a one-line error, before anything starts."""
    start = time.time()
    try:
        args = parse(argv)
        check(args)
    except SystemExit as e:  # --help, or a usage mistake said in one line
        return int(e.code or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_check(args, start)


if __name__ == "__main__":
    sys.exit(main())
