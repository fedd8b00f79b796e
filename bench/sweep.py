"""Seeds x variants x protocols as one sweep on Ray: each cell runs what run.sh runs for one variant.

    python bench/sweep.py --variants vanilla rope --seeds 0 1 --budget_minutes 30    # a local Ray, this machine
    python bench/sweep.py --seeds 0 1 2 3 4 --address auto --runs_per_gpu 4            # a running Ray cluster
    python bench/sweep.py --variants vanilla rope --seeds 0 1 --preset handout \\
        --pretrain_epochs 1 --finetune_epochs 1 --extra="--n_layer 2 --n_head 2 --n_embd 16"   # smoke sizes

A cell is a variant, a seed and an arm (a name and run.py flags, --arm NAME=FLAGS; one plain arm by default).
It runs run.sh's steps for its variant with run.sh's commands: pretrain; for the direct protocol finetune and
evaluate dev (with scores) and test; for the recite protocol the reader's finetune and its evaluations. Each cell
writes into OUT/<variant>_<arm>_seed<S>_<key>/, where the key hashes its settings and the data files; a cell
whose folder holds a finished cell.json is skipped, so the same command continues an interrupted sweep.

Ray: without --address a local Ray starts on 127.0.0.1 and stops with the sweep. A CPU cell asks for
--cpus_per_run cores (all of this machine's, as run.sh uses, unless given); a GPU cell for 1/K of a GPU
(--runs_per_gpu K; K = 1 for a local sweep on a machine with CUDA). A worker that dies (a killed process, a lost
node) is retried by Ray (--retries), and the step it was in continues from its checkpoint with --resume. A step
that refuses its input (exit 2: a bad flag, a missing file) fails its cell in one line and is not retried; the
other cells go on. The small files (predictions, sidecars, scores, logs; params with --fetch_params) come back
to the driver through Ray, so a cluster needs no shared storage; where it has it, they stay in place.

Out: OUT/rows.jsonl (the runs.jsonl lines of every finished cell, as `RECORD=1 bash run.sh` writes them) and
OUT/results.md (mean, spread and n over seeds), rewritten as cells finish. --record also appends each finished
cell's lines to bench/results/runs.jsonl and regenerates the README's tables (full cells of the plain recipe).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import hashlib
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from research import VARIANTS, append_jsonl  # noqa: E402

from run import FIELDS, extra_flags  # noqa: E402
from utils import UserError, atomic_path, file_sha256, locate_data, write_json_atomic, write_text_atomic  # noqa: E402

RAY_PIN = "ray==2.60.0"  # as requirements-dev.txt pins it
DATA = ("wiki.txt", "birth_places_train.tsv", "birth_dev.tsv", "birth_test_inputs.tsv")
PROTOCOLS = ("direct", "recite")
BOTTLENECK = 64  # run.sh's perceiver m
# What the sweep sets itself, so --extra and the arms may not (nor any file).
SWEEP_SETS = {
    "files": "the sweep names the files",
    "seed": "give --seeds",
    "preset": "give --preset",
    "max_epochs": "give --pretrain_epochs or --finetune_epochs",
    "budget_minutes": "give the sweep --budget_minutes",
    "recite": "give --protocols",
}
FILE_FLAGS = {f"--{k}" for k, f in FIELDS.items() if f.metadata["kind"] not in ("", "text")}
QUESTIONS = ["--finetune_corpus_path", "birth_places_train.tsv"]  # run.sh's finetunes' file
RETRIED_EXIT = {130, 137, 143}  # a step stopped by a signal (its own handler, or the shell's 128 + N)


@dataclass
class Cell:
    """One run of the sweep: what run.sh runs for `variant`, with `seed` and the arm's run.py flags."""

    variant: str
    seed: int
    arm: str
    flags: dict[str, list[str]]  # run.py flags by command (pretrain, finetune, evaluate): --extra, then the arm's
    preset: str
    protocols: list[str]
    pretrain_epochs: int | None = None
    finetune_epochs: int | None = None
    budget_minutes: float | None = None
    data_sha256: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """12 hex digits of the SHA-256 of every setting and data hash: the same cell, the same key."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"{self.variant}_{self.arm}_seed{self.seed}_{self.key}"


@dataclass
class Step:
    """A run.sh step: its name (times.txt, the log), run.py's arguments, and the params it trains (if any)."""

    name: str
    argv: list[str]
    trains: str | None = None


def cell_steps(cell: Cell, folder: str) -> list[Step]:
    """run.sh's steps for the cell's variant, its outputs in `folder` (run.sh's file names)."""
    v, f = cell.variant, Path(folder)
    common = ["--preset", cell.preset, "--seed", str(cell.seed), "--tb_dir", str(f / "tb")]
    common += ["--bottleneck_dim", str(BOTTLENECK)] if v == "perceiver" else []
    epochs = {"pretrain": cell.pretrain_epochs, "finetune": cell.finetune_epochs}
    limit = {k: ["--max_epochs", str(n)] if n else [] for k, n in epochs.items()}
    budget = ["--budget_minutes", str(cell.budget_minutes)] if cell.budget_minutes else []
    pretrained = str(f / f"{v}.pretrain.params")
    steps = [
        Step(f"{v}_pretrain", ["pretrain", v, "wiki.txt", "--writing_params_path", pretrained, *limit["pretrain"],
                               *budget, *common, *cell.flags["pretrain"]], pretrained),
    ]  # fmt: skip
    answers = {"direct": ("finetune", "pretrain", []), "recite": ("reader", "recite", ["--recite"])}
    for protocol in cell.protocols:
        step, prefix, recite = answers[protocol]  # the params' name is the step's: run.sh's files
        params, out = str(f / f"{v}.{step}.params"), str(f / f"{v}.{prefix}")
        evaluate = ["evaluate", v, "wiki.txt", "--reading_params_path", params, *common, *cell.flags["evaluate"]]
        steps += [
            Step(f"{v}_{step}", ["finetune", v, "wiki.txt", "--reading_params_path", pretrained, "--writing_params_path",
                                 params, "--finetune_corpus_path", "birth_places_train.tsv", *recite, *limit["finetune"],
                                 *common, *cell.flags["finetune"]], params),
            Step(f"{v}_{prefix}_dev", [*evaluate, "--eval_corpus_path", "birth_dev.tsv", "--outputs_path",
                                       f"{out}.dev.predictions", "--scores_path", f"{out}.dev.scores.tsv"]),
            Step(f"{v}_{prefix}_test", [*evaluate, "--eval_corpus_path", "birth_test_inputs.tsv", "--outputs_path",
                                        f"{out}.test.predictions"]),
        ]  # fmt: skip
    return steps


class CellFailed(Exception):
    """A step refused its input or failed: the cell stops, and Ray does not retry it (run_cell returns why)."""


class StepStopped(RuntimeError):
    """A step was stopped by a signal (the out-of-memory killer, a kill): Ray retries the cell."""


def die_with_parent() -> None:
    """In a step's process: die when the worker that started it dies (Linux), so a retry finds no stray step."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_step(step: Step, folder: Path, root: Path, threads: int | None) -> float:
    """Run one step (after a checkpoint, with --resume); its log in folder/<name>.log. Returns its seconds."""
    argv = [*step.argv]
    if step.trains and Path(step.trains + ".ckpt").exists():
        argv.append("--resume")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"} | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    start = time.perf_counter()
    with open(folder / f"{step.name}.log", "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, "src/run.py", *argv], cwd=root, env=env, stdout=log,
                              stderr=subprocess.STDOUT, preexec_fn=die_with_parent)  # fmt: skip
    if done.returncode < 0 or done.returncode in RETRIED_EXIT:
        raise StepStopped(f"step {step.name} stopped by a signal (exit {done.returncode})")
    if done.returncode != 0:
        lines = [line for line in (folder / f"{step.name}.log").read_text(errors="replace").splitlines() if line]
        said = next((line for line in reversed(lines) if "error" in line), lines[-1] if lines else "")
        raise CellFailed(f"step {step.name} (exit {done.returncode}): {said.strip()}")
    return time.perf_counter() - start


def finished_steps(folder: Path) -> set[str]:
    """The steps times.txt records as finished (run.sh's file: a name and seconds a line)."""
    times = folder / "times.txt"
    return {line.split()[0] for line in times.read_text().splitlines() if line.strip()} if times.exists() else set()


def place_data(code: Path, data: dict[str, bytes], hashes: dict[str, str]) -> None:
    """Write the driver's data files into code/data/ where they are missing (Ray ships the code without what
    .gitignore names); a file there that differs is refused (CellFailed)."""
    for name, content in data.items():
        path = code / "data" / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_name(f".{name}.tmp").write_bytes(content)
            os.replace(path.with_name(f".{name}.tmp"), path)
        elif hashlib.sha256(path.read_bytes()).hexdigest() != hashes[name]:  # not utils': a worker may lack src/
            raise CellFailed(f"{path} differs from the driver's {name} (SHA-256 {hashes[name][:12]}...)")


def run_cell(
    cell: Cell, folder: str, root: str | None, threads: int | None, fetch_params: bool, data: dict[str, bytes]
) -> dict:
    """A Ray task: run the cell's steps not yet finished in `folder` (in checkout `root`; None: this task's
    working directory, the code Ray shipped, given the driver's `data` files). Returns its small files by name,
    the machine and the seconds, or {"failed": the one-line reason} when a step refused its input."""
    code = Path(root) if root else Path.cwd()
    out = code / folder if not Path(folder).is_absolute() else Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "attempts.log", "a", encoding="utf-8") as attempts:  # the workers that ran the cell, by pid
        attempts.write(f"{os.getpid()} {socket.gethostname()} {datetime.datetime.now().isoformat()}\n")
    done, start = finished_steps(out), time.perf_counter()
    try:
        place_data(code, data, cell.data_sha256)
        for step in cell_steps(cell, str(out)):
            if step.name not in done:
                seconds = run_step(step, out, code, threads)
                with open(out / "times.txt", "a", encoding="utf-8") as times:
                    times.write(f"{step.name} {seconds:.0f}\n")
    except CellFailed as e:
        return {"failed": str(e)}
    sys.path.insert(0, str(code / "bench"))
    import research

    keep = (".predictions", ".json", ".tsv", ".log", ".txt") + ((".params",) if fetch_params else ())
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name.endswith(keep)}
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return {"files": files, "machine": research.machine_name(device), "host": socket.gethostname(),
            "seconds": time.perf_counter() - start}  # fmt: skip


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    """A cell's files as its worker wrote them, each atomically; a file already there with the same bytes
    (shared storage, this machine) is left alone."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = folder / name
        if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
            continue
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)


# ---------------------------------------------------------------------------------------------- the driver


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS, help="(default: all three)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="(default: 0)")
    p.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS, help="(default: both)")
    p.add_argument("--arm", action="append", default=[], metavar="NAME=FLAGS",
                   help="an arm: a name and run.py flags for its cells (repeatable; default: one arm, plain)")  # fmt: skip
    p.add_argument("--extra", default="", help="run.py flags for every cell, each given to the steps taking it")
    p.add_argument("--preset", choices=["handout", "cpu"], help="(default: handout on GPUs, else cpu)")
    p.add_argument("--budget_minutes", type=float, help="each pretraining's minutes (default: the preset's)")
    p.add_argument("--pretrain_epochs", type=int, help="pretraining epochs (default: the preset's)")
    p.add_argument("--finetune_epochs", type=int, help="finetuning and reader epochs (default: the preset's)")
    p.add_argument("--out", default="outputs/sweep", help="the sweep's folder (default: outputs/sweep)")
    p.add_argument("--address", help="a running Ray cluster (e.g. auto, or ray://host:10001); default: a local Ray")
    p.add_argument("--runs_per_gpu", type=int, help="K: runs sharing one GPU, each asking for 1/K of it")
    p.add_argument("--cpus_per_run", type=int, help="cores a CPU cell asks for (default: this machine's)")
    p.add_argument("--retries", type=int, default=3, help="times Ray retries a cell whose worker died (default 3)")
    p.add_argument("--fetch_params", action="store_true", help="bring the params back too (tens of MB a cell)")
    p.add_argument("--record", action="store_true", help="append rows to bench/results/runs.jsonl, regenerate README")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> Iterator[str]:
    """The sweep's settings' problems, one line each."""
    for name in ("seeds", "variants", "protocols"):
        values = getattr(args, name)
        yield from (f"--{name}: {v} is named twice" for v in sorted(set(values)) if values.count(v) > 1)
    yield from (f"--seeds: {s} is not from 0 to 2**32 - 1" for s in args.seeds if not 0 <= s < 2**32)
    for name in ("pretrain_epochs", "finetune_epochs", "runs_per_gpu", "cpus_per_run"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            yield f"--{name} must be at least 1, got {getattr(args, name)}"
    if args.runs_per_gpu and not args.address and not torch.cuda.is_available():
        yield "--runs_per_gpu: this machine has no GPU (CUDA); leave it out to run on its CPUs"
    if args.retries < 0:
        yield f"--retries must be 0 or more, got {args.retries}"
    if args.budget_minutes is not None and not (math.isfinite(args.budget_minutes) and args.budget_minutes > 0):
        yield f"--budget_minutes must be a positive number of minutes, got {args.budget_minutes}"
    names = [arm.partition("=")[0] for arm in args.arm]
    for arm, name in zip(args.arm, names, strict=True):
        if "=" not in arm or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            yield f"--arm {arm!r}: give NAME=FLAGS, a name of letters, digits, '-', '_' or '.'"
        elif names.count(name) > 1:
            yield f"--arm: {name} is named twice"
    out = Path(args.out)
    if out.exists() and not out.is_dir() or out.is_symlink():
        yield f"--out {args.out}: not a folder (a symlink or a file); give a folder name"
    tracked = subprocess.run(["git", "ls-files", "--", str(out.resolve())], cwd=ROOT, capture_output=True, text=True)
    if tracked.stdout.strip():
        yield f"--out {args.out}: holds files git tracks; choose another folder, e.g. outputs/sweep"
    smoke = args.extra or any(arm.partition("=")[2].strip() for arm in args.arm)
    if args.record and (smoke or args.pretrain_epochs or args.finetune_epochs or len(args.protocols) < 2):
        yield "--record records full cells of the plain recipe only: no --extra, arm flags, epochs or protocols"


def data_hashes() -> dict[str, str]:
    """SHA-256 of each data file the steps read (data/ holds them after bash setup.sh)."""
    missing = [name for name in DATA if not locate_data(name).is_file()]
    if missing:
        raise UserError(f"data file {missing[0]} not found; run bash setup.sh first (the data step)")
    return {name: file_sha256(locate_data(name)) for name in DATA}


def make_cells(args: argparse.Namespace, preset: str) -> list[Cell]:
    """Every cell of the sweep, arm by arm, then seed, then variant; flags checked as run.sh checks EXTRA_FLAGS."""
    arms = [arm.partition("=")[::2] for arm in args.arm] or [("plain", "")]
    hashes, cells = data_hashes(), []
    for arm, words in arms:
        name = "--extra and --arm " + arm if args.extra and words else "--extra" if args.extra else "--arm " + arm
        given = shlex.split(args.extra) + shlex.split(words)
        # Mixed pretraining (--mix_share) reads the finetunes' questions file, which the sweep names for it too.
        mixed = any(w.partition("=")[0] == "--mix_share" for w in given)
        if mixed and any(w.partition("=")[0] in FILE_FLAGS for w in given):
            raise UserError(f"{name} must not name a file: {SWEEP_SETS['files']}")
        sets = {**SWEEP_SETS, "files": ""} if mixed else SWEEP_SETS
        flags = extra_flags(given + QUESTIONS * mixed, preset, args.variants, name, sets)
        for seed in args.seeds:
            for variant in args.variants:
                cells.append(Cell(variant, seed, arm, flags, preset, list(args.protocols), args.pretrain_epochs,
                                  args.finetune_epochs, args.budget_minutes, hashes))  # fmt: skip
    return cells


def finished(folder: Path, key: str) -> dict | None:
    """A cell folder's cell.json when it records a finished cell of this key, else None."""
    with contextlib.suppress(OSError, ValueError):
        record = json.loads((folder / "cell.json").read_text())
        if isinstance(record, dict) and record.get("key") == key and isinstance(record.get("rows"), list):
            return record
    return None


def cell_command(cell: Cell, args: argparse.Namespace) -> str:
    """The sweep command that runs this one cell: its rows' "command"."""
    words = ["python", "bench/sweep.py", "--variants", cell.variant, "--seeds", str(cell.seed), "--preset", cell.preset]
    words += ["--protocols", *cell.protocols] if len(cell.protocols) < len(PROTOCOLS) else []
    words += [f"--arm={a}" for a in args.arm if a.partition("=")[0] == cell.arm]
    for name in ("extra", "budget_minutes", "pretrain_epochs", "finetune_epochs"):
        words += [f"--{name}={getattr(args, name)}"] if getattr(args, name) else []
    return shlex.join(words)


@contextlib.contextmanager
def no_interruption() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block ends: a cell's files and rows are written whole or not at all."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def record_cell(cell: Cell, result: dict, folder: Path, args: argparse.Namespace, gold: tuple) -> dict:
    """Write the cell's files and its cell.json (the rows `RECORD=1 bash run.sh` would append, scored against
    `gold`, report.gold_and_documents); with --record, append them to bench/results/runs.jsonl. Returns the record."""
    import report

    write_files(folder, result["files"])
    rows = report.folder_rows(folder, *gold)
    lines = report.record_rows(rows, result["machine"], folder, cell.preset, cell.seed, cell_command(cell, args))
    record = {"key": cell.key, "cell": asdict(cell), "host": result["host"], "rows": lines,
              "minutes": round(result["seconds"] / 60, 2), "finished": datetime.datetime.now().isoformat()}  # fmt: skip
    write_json_atomic(folder / "cell.json", record)
    if args.record:
        append_jsonl(report.RUNS_JSONL, lines)
    return record


def summary(records: list[dict]) -> tuple[str, list[dict]]:
    """The results table (a line per variant, arm and protocol: dev per seed, mean, spread, n) and the rows."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    rows = []
    for record in records:
        for row in record["rows"]:
            groups[(row["run"], record["cell"]["arm"], row["protocol"])].append(row)
            rows.append({**row, "arm": record["cell"]["arm"]})
    lines = [
        "| variant | arm | protocol | n | seeds | dev % per seed | mean | spread (sd) | place in recitation | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (run, arm, protocol), group in sorted(groups.items()):
        group.sort(key=lambda r: r["seed"])
        dev = [r["dev_accuracy"] * 100 for r in group]
        spread = f"{statistics.stdev(dev):.1f}" if len(dev) > 1 else "-"
        held = [r["place_in_recitation"] * 100 for r in group if "place_in_recitation" in r]
        ceiling = f"{statistics.mean(held):.1f}%" if held else "-"
        minutes = statistics.mean(r["minutes"] + r.get("extra_minutes", 0) for r in group)
        lines.append(
            f"| {run} | {arm} | {protocol} | {len(group)} | {', '.join(str(r['seed']) for r in group)} | "
            f"{', '.join(f'{d:.1f}' for d in dev)} | **{statistics.mean(dev):.1f}** | {spread} | {ceiling} | "
            f"{minutes:.1f} |"
        )
    return "\n".join(lines) + "\n", rows


def write_summary(out: Path, records: list[dict], about: str) -> str:
    """OUT/results.md and OUT/rows.jsonl from the finished cells' records, each written atomically."""
    table, rows = summary(records)
    write_text_atomic(out / "results.md", f"# Sweep results\n\n{about}\n\n{table}")
    write_text_atomic(out / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return table


def start_ray(args: argparse.Namespace) -> tuple[object, dict]:
    """Ray, started locally on 127.0.0.1 or joined at --address; returns the module and the cluster's resources."""
    try:
        import ray
    except ImportError:
        raise UserError(f"the sweep needs Ray: pip install {RAY_PIN} (bash test.sh's set-up installs it)") from None
    import logging

    options = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    if args.address:
        runtime_env = {"working_dir": str(ROOT), "excludes": [".git", ".venv", "outputs", "expt", "*.params*"]}
        try:
            ray.init(address=args.address, runtime_env=runtime_env, **options)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UserError(f"--address {args.address}: {str(e).strip().splitlines()[0]}") from None
    else:
        ray.init(num_cpus=os.cpu_count(), _node_ip_address="127.0.0.1", **options)
    return ray, ray.cluster_resources()


def on_gpus(args: argparse.Namespace) -> bool:
    """GPU cells: asked for with --runs_per_gpu, or a local sweep on a machine with CUDA."""
    return bool(args.runs_per_gpu) or not args.address and torch.cuda.is_available()


def resources(args: argparse.Namespace, cluster: dict) -> tuple[dict, int]:
    """What a cell asks Ray for, and how many cells the cluster runs at once."""
    if on_gpus(args):
        if not cluster.get("GPU"):
            raise UserError("--runs_per_gpu: this Ray cluster has no GPU; leave it out to run on CPUs")
        k = args.runs_per_gpu or 1
        return {"num_cpus": 1, "num_gpus": 1 / k}, int(cluster["GPU"] * k)
    cores = args.cpus_per_run or os.cpu_count() or 1
    if cores > cluster.get("CPU", 0):
        raise UserError(f"--cpus_per_run {cores}: the Ray cluster has {cluster.get('CPU', 0):g} cores")
    return {"num_cpus": cores}, max(1, int(cluster["CPU"] // cores))


def say_plan(todo: list[Cell], skipped: int, asks: dict, at_once: int, args: argparse.Namespace) -> None:
    where = (
        f"the Ray cluster at {args.address}"
        if args.address
        else f"a local Ray on this machine ({os.cpu_count()} cores)"
    )
    each = f"{asks['num_gpus']:.3g} GPU" if "num_gpus" in asks else f"{asks['num_cpus']} cores"
    print(f"sweep: {len(todo) + skipped} cells, {skipped} already finished in {args.out}, {len(todo)} to run")
    print(f"sweep: on {where}; each cell asks for {each}, so {min(at_once, max(len(todo), 1))} run at once")
    for cell in todo:
        print(f"  {cell.name}: {' '.join(cell.protocols)}")


def finished_line(cell: Cell, record: dict) -> str:
    figures = ", ".join(f"{r['protocol']} {r['dev_accuracy'] * 100:.1f}%" for r in record["rows"])
    return f"sweep: {cell.name} done on {record['host']}: dev {figures or 'not scored'}; {record['minutes']:.1f} min"


def run_sweep(args: argparse.Namespace, ray: object, todo: list[Cell], asks: dict, at_once: int) -> list[str]:
    """Run the cells on Ray, recording each as it finishes; returns the failed cells' lines."""
    local = None if args.address else str(ROOT)
    threads = None if "num_gpus" in asks else asks["num_cpus"]
    # A retry follows a worker's death or a step stopped by a signal: a refusal returns, it raises nothing.
    task = ray.remote(run_cell).options(max_retries=args.retries, retry_exceptions=True, **asks)
    out = Path(args.out)
    # Where the worker writes: this machine's folder, or on a cluster a relative --out under the shipped code.
    target = {c.name: str((out / c.name).resolve() if local or out.is_absolute() else out / c.name) for c in todo}
    data = ray.put({} if local else {name: locate_data(name).read_bytes() for name in DATA})  # once, shared
    pending = {task.remote(c, target[c.name], local, threads, args.fetch_params, data): c for c in todo}
    import report

    gold = report.gold_and_documents(locate_data("birth_dev.tsv"), locate_data("wiki.txt"))  # once, for every cell
    failed, minutes, start = [], [], time.perf_counter()
    while pending:
        [ready], _ = ray.wait(list(pending), num_returns=1)
        cell = pending.pop(ready)
        try:
            result = ray.get(ready)
        except Exception as e:  # the worker died, or a step was stopped, more than --retries times
            cause = getattr(e, "cause", None) or e
            result = {"failed": f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"}
        if "failed" in result:
            failed.append(f"sweep: {cell.name} failed: {result['failed']}")
            print(failed[-1], file=sys.stderr)
            continue
        with no_interruption():
            record = record_cell(cell, result, out / cell.name, args, gold)
        minutes.append(record["minutes"])
        left = math.ceil(len(pending) / at_once) * statistics.mean(minutes)
        so_far = (time.perf_counter() - start) / 60
        print(
            finished_line(cell, record)
            + (f"; about {left:.0f} min left, {so_far + left:.0f} in all" if pending else "")
        )
    print(f"sweep: {len(todo) - len(failed)} of {len(todo)} cells run in {(time.perf_counter() - start) / 60:.1f} min")
    return failed


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when every cell finished, 1 when some failed, 2 after a one-line error, 130 on Ctrl-C."""
    args = parse_args(argv)
    ray = None
    try:
        if problem := next(check_args(args), None):
            raise UserError(problem)
        cells = make_cells(args, args.preset or ("handout" if on_gpus(args) else "cpu"))
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"--out {args.out}: cannot be made ({e.strerror})") from None
        todo, failed = [c for c in cells if not finished(out / c.name, c.key)], []
        if todo:  # Ray starts only for work
            ray, cluster = start_ray(args)
            asks, at_once = resources(args, cluster)
            say_plan(todo, len(cells) - len(todo), asks, at_once, args)
            failed = run_sweep(args, ray, todo, asks, at_once)
        else:
            print(f"sweep: all {len(cells)} cells already finished in {args.out}")
        records = [r for c in cells if (r := finished(out / c.name, c.key))]
        about = f"{len(records)} of {len(cells)} cells finished; `python bench/sweep.py {shlex.join(argv or sys.argv[1:])}`."
        print(write_summary(out, records, about))
        if args.record:
            import tables

            tables.main([])
        return 1 if failed else 0
    except UserError as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sweep: interrupted; finished cells are recorded, and the same command continues the rest "
              "(a step resumes from its checkpoint)", file=sys.stderr)  # fmt: skip
        return 130
    finally:
        if ray is not None:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
