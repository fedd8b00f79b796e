"""The course's numbers on a CUDA GPU: the handout's exact recipe for every variant, runs sharing one GPU.

    python bench/gpu_check.py                       # tests/test_cuda.py, then the 3 variants (seed 0) in parallel
    python bench/gpu_check.py --seeds 1 --skip_tests  # a second seed, in another call
    python bench/gpu_check.py --runs rope:0 rope:1 --speed --fp32   # these runs in fp32, after a speed check
    GPU_CHECK_TINY=1 python bench/gpu_check.py      # a rehearsal on any machine, CPU included, in a few minutes

What it does:
  1. starts `pytest tests/test_cuda.py` (its log: <workdir>/test_cuda.log);
  2. starts, side by side, the handout's pretrain -> finetune -> evaluate (dev and test) for each
     variant and seed, exactly the handout's commands (`--preset handout`, the default: 650 epochs,
     batch 128, lr 6e-3, dropout 0.1; the perceiver with --bottleneck_dim 64 --pretrain_lr 6e-3);
     the model is small and the GPU waits on kernel launches, so several runs share it well;
     then, while the deadline leaves time, the recite protocol: a reader (`finetune --recite`) and
     its dev and test predictions;
  3. after about a minute, measures each run's epoch time, says whether the 650 epochs fit before
     --deadline_minutes, and if they do not, stops the highest seeds until they do (the others then
     run faster); what it stopped is recorded as stopped;
  4. appends one JSON line per finished run and protocol to --results (default bench/results/gpu.jsonl): the
     GPU, torch and CUDA versions, the attention kernel, the seconds of each step and the dev
     accuracy; and prints a table beside the handout's published figures.

The tiny mode (GPU_CHECK_TINY=1 or --tiny) trains 2 pretraining and 1 finetuning epoch and
answers 20 dev and test lines, to rehearse the whole script before spending device time; its
rows go to --results only when that is given explicitly.
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

from research import LoggedEpochs, accuracy, cpu_name, predictions_sidecar, tensorboard_prefix  # noqa: E402

import attention  # noqa: E402
import machine as machine_policy  # noqa: E402

RUN_PY = str(ROOT / "src" / "run.py")
VARIANT_FLAGS = {
    "vanilla": [],
    "perceiver": ["--bottleneck_dim", "64"],  # the 2023 handout's perceiver commands
    "rope": [],
}
PRETRAIN_ONLY_FLAGS = {"perceiver": ["--pretrain_lr", "6e-3"]}
# Dev accuracy the course published for the handout's recipe (2023 handout: vanilla, perceiver).
PUBLISHED = {"vanilla": 0.214, "perceiver": 0.170}
HANDOUT_EPOCHS = 650
AFTER_PRETRAIN_SECONDS = 45  # finetune (10 epochs) and two evaluations, as a margin for the plan
RECITE_SECONDS = 60  # reader (recite 2,000 people, finetune 10 epochs) and two reciting evaluations
RECITE_STEPS = ("reader", "recite_dev", "recite_test")
DEV_PREDICTIONS = {"evaluate": "dev.predictions", "recite_dev": "recite_dev.predictions"}  # a protocol's dev answers


class Slots:
    """How many runs may go at once, and the CPU threads each gets: all at once sharing a GPU;
    one at a time on a CPU, where parallel torch processes slow each other several times over."""

    def __init__(self, runs: int):
        self.parallel = runs if torch.cuda.is_available() else 1
        self.semaphore = threading.Semaphore(self.parallel)
        self.threads = max(1, (os.cpu_count() or 1) // self.parallel)


class Run:
    """One variant and seed: its pipeline runs in a thread, one command after another."""

    def __init__(self, variant: str, seed: int, folder: Path, tiny: bool, data: dict[str, str], slots: Slots,
                 on_result: Callable[[Run, str], None], recite_until: float | None = None,
                 training_flags: list[str] | None = None):  # fmt: skip
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
        pre, fine = "pretrain.params", "finetune.params"
        pretrain_epochs = ["--max_epochs", "2"] if tiny else []
        finetune_epochs = ["--max_epochs", "1"] if tiny else []
        finetune_epochs += training_flags or []
        pretrain_epochs += training_flags or []
        self.commands = {
            "pretrain": ["pretrain", *common, "--writing_params_path", pre, *PRETRAIN_ONLY_FLAGS.get(variant, []),
                         *pretrain_epochs],
            "finetune": ["finetune", *common, "--reading_params_path", pre, "--writing_params_path", fine,
                         "--finetune_corpus_path", "birth_places_train.tsv", *finetune_epochs],
            "evaluate": ["evaluate", *common, "--reading_params_path", fine, "--eval_corpus_path", data["dev"],
                         "--outputs_path", "dev.predictions"],
            "evaluate_test": ["evaluate", *common, "--reading_params_path", fine, "--eval_corpus_path",
                              data["test"], "--outputs_path", "test.predictions"],
            # the recite protocol: a reader finetuned from the same pretrained params on recitations
            "reader": ["finetune", *common, "--reading_params_path", pre, "--writing_params_path", "reader.params",
                       "--finetune_corpus_path", "birth_places_train.tsv", "--recite", *finetune_epochs],
            "recite_dev": ["evaluate", *common, "--reading_params_path", "reader.params", "--eval_corpus_path",
                           data["dev"], "--outputs_path", "recite_dev.predictions"],
            "recite_test": ["evaluate", *common, "--reading_params_path", "reader.params", "--eval_corpus_path",
                            data["test"], "--outputs_path", "recite_test.predictions"],
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
                code = self.proc.wait()
            self.seconds[step] = round(time.time() - t0, 1)
            if code != 0:
                if not self.stopped:
                    self.failed = f"{step} exited with code {code}; see {self.folder / f'{step}.log'}"
                return
            if step in DEV_PREDICTIONS:  # a row as soon as a protocol has its dev figure
                self.found[step] = predictions_sidecar(self.folder / DEV_PREDICTIONS[step])
                self.on_result(self, "direct" if step == "evaluate" else "recite")

    def epochs_done(self) -> int:
        """Pretraining epochs finished so far, from the pretraining's TensorBoard log."""
        if "pretrain" in self.seconds:
            return HANDOUT_EPOCHS
        return 0 if self.logged_epochs is None else self.logged_epochs()

    def observe(self) -> None:
        done = self.epochs_done()
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

    def accuracy(self, step: str = "evaluate") -> tuple[int, int] | None:
        """(correct, total) on dev, once evaluated (step "recite_dev": by the recite protocol)."""
        found = self.found.get(step, {})
        return (found["correct"], found["with_places"]) if accuracy(found) is not None else None

    def place_in_recitation(self) -> float | None:
        """The share of dev recitations holding the gold place (the reader's ceiling), once evaluated."""
        return self.found.get("recite_dev", {}).get("place_in_recitation")


def machine() -> dict:
    """The GPU (or CPU) and software a row was measured with."""
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        info["device"] = "cuda"
        info["gpu"] = torch.cuda.get_device_name(0)
        info["attention_kernel"] = ",".join(k.name for k in attention.CUDA_ATTENTION_KERNELS)
        chosen = machine_policy.choose(torch.device("cuda"), say=False)  # what run.py trains in, measured
        info["precision"] = chosen["precision"]
        info["precision_gflops"] = {k: chosen[k] for k in ("bf16_gflops", "fp32_gflops")}
    else:
        info["device"] = "cpu"
        info["cpu"] = cpu_name()
    return info


def first_lines(source: Path, dest: Path, n: int) -> str:
    dest.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    return str(dest)


def projected_end(run: Run, since: float) -> float | None:
    """When `run` should finish everything, at its pace since `since`; None until that can be told."""
    pace = run.pace(since)
    if pace is None:
        return None
    done, when = run.epoch_times[-1]
    return when + (HANDOUT_EPOCHS - done) * pace + AFTER_PRETRAIN_SECONDS


def supervise(runs: list[Run], deadline: float, tiny: bool, keep_going: bool = False) -> None:
    """Wait for every run; once paces are known, stop the highest seeds while the rest would not fit
    (with keep_going, only say so: each run then gets as far as the device's time allows)."""
    since, decided = time.time(), tiny  # the tiny rehearsal has nothing to plan
    while any(r.thread.is_alive() for r in runs):
        time.sleep(2)
        live = [r for r in runs if r.thread.is_alive() and not r.stopped]
        for r in live:
            r.observe()
        if decided:
            continue
        ends = [projected_end(r, since) for r in live if "pretrain" not in r.seconds]
        if not ends or None in ends:
            continue
        latest = max(ends)
        left = (latest - time.time()) / 60
        seeds = sorted({r.seed for r in live})
        if latest <= deadline:
            print(f"plan: at the measured paces all {len(live)} runs finish in about {left:.1f} min, inside the "
                  f"deadline ({(deadline - time.time()) / 60:.1f} min left)", flush=True)  # fmt: skip
            decided = True
        elif keep_going:
            print(f"plan: the slowest run would need about {left:.1f} min, past the deadline "
                  f"({(deadline - time.time()) / 60:.1f} min left); keeping every run going", flush=True)  # fmt: skip
            decided = True
        elif len(seeds) > 1:
            for r in live:
                if r.seed == seeds[-1]:
                    r.stop("stopped to fit the deadline")
            print(f"plan: {len(live)} runs would need about {left:.1f} min, past the deadline: stopped seed "
                  f"{seeds[-1]}; measuring again", flush=True)  # fmt: skip
            since = time.time()
        else:
            print(f"plan: even one seed needs about {left:.1f} min, past the deadline "
                  f"({(deadline - time.time()) / 60:.1f} min left); the 650 epochs do not fit", flush=True)  # fmt: skip
            decided = True


class Results:
    """Where finished runs go, one JSON line each, written as each run ends (a run cut short by the
    device's time limit loses nothing already finished)."""

    def __init__(self, path: Path | None, info: dict, tiny: bool, tests: subprocess.Popen | None):
        self.path, self.info, self.tiny, self.tests = path, info, tiny, tests
        self.lock = threading.Lock()

    def tests_passed(self) -> bool | None:
        """True or False once tests/test_cuda.py has finished; None while it runs or if skipped."""
        code = None if self.tests is None else self.tests.poll()
        return None if code is None else code == 0

    def append(self, r: Run, protocol: str) -> None:
        """One row for run r's dev figure by `protocol` ("direct" or "recite")."""
        acc = r.accuracy("evaluate" if protocol == "direct" else "recite_dev")
        if acc is None or self.path is None:
            return
        steps = ("finetune", "evaluate", "evaluate_test") if protocol == "direct" else RECITE_STEPS
        name = f"{r.variant}_{self.info['device']}_handout_seed{r.seed}" + ("_recite" if protocol == "recite" else "")
        row = {
            "name": name + ("_tiny" if self.tiny else ""), "protocol": protocol,
            "date": datetime.date.today().isoformat(), "variant": r.variant, "recipe": "handout", "seed": r.seed,
            **self.info, "pretrain_epochs": 2 if self.tiny else HANDOUT_EPOCHS,
            "runs_sharing_device": r.slots.parallel, "pretrain_seconds": r.seconds["pretrain"],
            "finetune_seconds": r.seconds["finetune"], "evaluate_seconds": r.seconds["evaluate"],
            "dev_correct": acc[0], "dev_total": acc[1], "dev_accuracy": acc[0] / acc[1],
            "tests_cuda_passed": self.tests_passed(), **trainer_settings(r.folder / "pretrain.params.json"),
            "commands": [" ".join(["python src/run.py", *r.commands[s]]) for s in ("pretrain", *steps)],
        }  # fmt: skip
        if protocol == "recite":
            row["place_in_recitation"] = r.place_in_recitation()
            row["extra_minutes"] = round(sum(r.seconds[s] for s in ("reader", "recite_dev")) / 60, 2)
            row["reader_seconds"] = r.seconds["reader"]
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def trainer_settings(sidecar: Path) -> dict:
    """How the pretraining batched its examples and which parameters it decayed, from run.py's sidecar."""
    config = json.loads(sidecar.read_text())["config"]
    return {"order": config["order"], "decay": config["decay"]}


def print_table(runs: list[Run]) -> None:
    print("\n| variant | seed | pretrain | finetune | evaluate | dev, direct | published | place in recitation "
          "| dev, recite | reader |\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in runs:
        status = r.stopped or r.failed or "not finished"
        direct, recite = r.accuracy(), r.accuracy("recite_dev")
        dev = f"{direct[0] / direct[1]:.1%} ({direct[0]}/{direct[1]})" if direct else status
        recited = f"{recite[0] / recite[1]:.1%} ({recite[0]}/{recite[1]})" if recite else "-"
        ceiling = f"{r.place_in_recitation():.1%}" if recite else "-"
        published = f"{PUBLISHED[r.variant]:.1%}" if r.variant in PUBLISHED else "-"
        minutes = [
            f"{r.seconds[s] / 60:.1f} min" if s in r.seconds else "-" for s in ("pretrain", "finetune", "reader")
        ]
        print(f"| {r.variant} | {r.seed} | {minutes[0]} | {minutes[1]} | {r.seconds.get('evaluate', '-')} s | "
              f"{dev} | {published} | {ceiling} | {recited} | {minutes[2]} |", flush=True)  # fmt: skip


def speed_check(workdir: Path, tiny: bool) -> None:
    """The handout's vanilla pretraining step at batch 128, reference against fast path, on this device,
    alone before the runs start (bench/bench_speed.py; its files and log go to workdir, its figures are read
    from its JSON output)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = ["--ref_steps", "1", "--fast_steps", "2"] if tiny else ["--ref_steps", "10", "--fast_steps", "30"]
    argv = [sys.executable, str(ROOT / "bench" / "bench_speed.py"), "--parts", "train", "--variants", "vanilla",
            "--device", device, *steps, "--out", str(workdir / "speed.json"), "--jsonl", str(workdir / "speed.jsonl")]  # fmt: skip
    t0 = time.time()
    with open(workdir / "speed.log", "w") as log:
        code = subprocess.call(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        print(f"speed ({time.time() - t0:.0f} s): exit {code}, no figure; see {workdir / 'speed.log'}", flush=True)
        return
    step = {r["impl"]: r["seconds_per_step"] for r in json.loads((workdir / "speed.json").read_text())["train"]}
    print(f"speed ({time.time() - t0:.0f} s): reference {step['reference']:.3f} s/step, fast {step['fast']:.3f} "
          f"s/step ({step['reference'] / step['fast']:.1f}x)", flush=True)  # fmt: skip


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANT_FLAGS), choices=list(VARIANT_FLAGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="seeds to start, the highest stopped first "
                   "if they do not fit (default 0: on an H200 three runs of 650 epochs take about 7 minutes)")  # fmt: skip
    p.add_argument("--runs", nargs="+", default=None, metavar="VARIANT:SEED",
                   help="exactly these runs instead of every variant x seed, e.g. vanilla:0 vanilla:1 rope:0")  # fmt: skip
    p.add_argument("--deadline_minutes", type=float, default=8.5, help="when every run should be done")
    p.add_argument("--workdir", type=Path, default=ROOT / "bench" / "runs" / "gpu_check")
    p.add_argument("--results", type=Path, default=None, help="JSONL to append to (bench/results/gpu.jsonl)")
    p.add_argument("--tiny", action="store_true", default=os.environ.get("GPU_CHECK_TINY") == "1")
    p.add_argument("--skip_tests", action="store_true", help="do not run tests/test_cuda.py")
    p.add_argument("--speed", action="store_true", help="first time vanilla's pretraining step, reference vs fast")
    p.add_argument("--keep_going", action="store_true", help="never stop a run to let the others fit the deadline")
    p.add_argument("--fp32", action="store_true", help="train in fp32: on an H100 the fast path's bf16 casts cost "
                   "more than they save at this model's size (bench_speed.py --device cuda --fp32)")  # fmt: skip
    p.add_argument("--no_recite", action="store_true", help="the direct protocol only (no reader)")
    args = p.parse_args(argv)
    if args.results is None and not args.tiny:
        args.results = ROOT / "bench" / "results" / "gpu.jsonl"
    start = time.time()
    deadline = start + args.deadline_minutes * 60
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = {"dev": "birth_dev.tsv", "test": "birth_test_inputs.tsv"}
    if args.tiny:
        for key, name in data.items():
            data[key] = first_lines(ROOT / "data" / name, args.workdir / f"{key}20.tsv", 20)
    info = machine()
    if args.fp32:
        info["precision"] = "fp32"
    print(f"gpu_check on {info.get('gpu', info.get('cpu'))}, torch {info['torch']}, CUDA {info['cuda']}", flush=True)
    if args.speed:
        speed_check(args.workdir, args.tiny)
    tests = None
    if not args.skip_tests:
        with open(args.workdir / "test_cuda.log", "w") as log:  # the child keeps its own handle
            tests = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_cuda.py"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
    results = Results(args.results, info, args.tiny, tests)
    pairs = [(v, s) for s in args.seeds for v in args.variants]
    if args.runs:
        pairs = [(r.split(":")[0], int(r.split(":")[1])) for r in args.runs]
        if any(v not in VARIANT_FLAGS for v, _ in pairs):
            p.error(f"--runs: variants are {', '.join(VARIANT_FLAGS)}")
    slots = Slots(len(pairs))
    recite_until = None if args.no_recite else deadline - RECITE_SECONDS
    flags = ["--fp32"] if args.fp32 else []
    runs = [Run(v, s, args.workdir / f"{v}_seed{s}", args.tiny, data, slots, results.append, recite_until, flags)
            for v, s in pairs]  # fmt: skip
    signal.signal(signal.SIGTERM, interrupt)  # `timeout` around this script: report what finished
    try:
        for r in runs:
            r.thread.start()
        supervise(runs, deadline, args.tiny, args.keep_going)
        if tests is not None:
            tests.wait()
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the report short
        print("interrupted: stopping the runs still going", flush=True)
        for r in runs:
            r.stop("stopped: the script was interrupted")
    passed = results.tests_passed()
    if tests is not None:
        summary = (args.workdir / "test_cuda.log").read_text(errors="replace").strip().splitlines()
        verdict = {True: "passed", False: "FAILED", None: "not finished"}[passed]
        print(f"tests/test_cuda.py: {verdict} ({summary[-1] if summary else ''})")
    print_table(runs)
    print(f"\nwall clock {(time.time() - start) / 60:.1f} min; rows appended to {args.results}")
    return 0 if all(r.accuracy() or r.stopped for r in runs) and passed is not False else 1


if __name__ == "__main__":
    sys.exit(main())
