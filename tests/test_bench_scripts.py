"""Specification of what the bench scripts read from run.py's records: the predictions' and the params'
JSON sidecars and the TensorBoard log, never its printed lines; and of how bench_scaling.py, plot_scaling.py
and gpu_check.py take hostile flag values: refused in one line, exit code 2, before any work, nothing written."""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import PEOPLE, REPO_ROOT
from torch.utils.tensorboard import SummaryWriter

import logs
import machine
import run
import utils
from bench import bench_epoch, bench_scaling, gpu_check, plot_scaling, report, research
from bench.research import (
    LoggedEpochs,
    accuracy,
    predictions_sidecar,
    reader_copies,
    reader_examples,
    tensorboard_prefix,
)


def write_predictions_sidecar(path: Path, found: dict) -> Path:
    """A predictions file and its sidecar <path>.json, as `run.py evaluate --outputs_path path` writes them."""
    path.write_text("Paris\n" * found["questions"], encoding="utf-8")
    Path(f"{path}.json").write_text(json.dumps(found), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------
# The predictions' sidecar


def test_the_accuracy_of_an_evaluation_comes_from_its_predictions_sidecar(tmp_path):
    found = {"questions": 5, "with_places": 4, "correct": 3, "accuracy": 0.75, "seconds": 1.0}
    predictions = write_predictions_sidecar(tmp_path / "dev.predictions", found)
    assert predictions_sidecar(predictions) == found
    assert accuracy(predictions_sidecar(predictions)) == 0.75


def test_predictions_without_a_sidecar_have_no_accuracy(tmp_path):
    (tmp_path / "london.dev.predictions").write_text("London\n", encoding="utf-8")
    assert predictions_sidecar(tmp_path / "london.dev.predictions") == {}
    assert accuracy({}) is None


def test_answers_to_questions_without_places_have_no_accuracy():
    assert accuracy({"questions": 437, "with_places": 0, "correct": 0}) is None


def test_a_readers_answers_are_spans_where_its_predictions_sidecar_records_the_recitations_ceiling():
    assert reader_copies({"questions": 4, "with_places": 4, "correct": 3, "place_in_recitation": 0.75})
    assert not reader_copies({"questions": 4, "with_places": 4, "correct": 3})  # direct answers
    assert not reader_copies({})  # evaluated before predictions had a sidecar


def test_report_takes_the_accuracy_from_the_predictions_sidecar_without_the_gold_file(tiny_corpus, tmp_path):
    runs = tmp_path / "outputs"
    runs.mkdir()
    write_predictions_sidecar(runs / "vanilla.pretrain.dev.predictions", {"questions": 4, "with_places": 4,
                              "correct": 1, "accuracy": 0.25})  # fmt: skip
    out = tmp_path / "report.md"
    argv = ["--runs", str(runs), "--gold", str(tmp_path / "missing.tsv"), "--corpus", str(tiny_corpus)]
    assert report.main([*argv, "--out", str(out)]) == 0
    numbers = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert numbers["vanilla, pretrain + finetune"]["accuracy"] == 0.25


# ---------------------------------------------------------------------------
# The params' sidecars


def test_a_reader_trained_on_the_recitations_that_held_their_place():
    side = {"recitations": {"people": len(PEOPLE), "kept": 5, "place_share": 0.625, "seconds": 1.0}}
    assert reader_examples(side) == 5


def test_a_reader_whose_recitations_held_no_place_trained_on_them_all():
    side = {"recitations": {"people": len(PEOPLE), "kept": 0, "place_share": 0.0, "seconds": 1.0}}
    assert reader_examples(side) == len(PEOPLE)


def test_a_reader_trained_before_its_sidecar_recorded_its_recitations_has_no_count():
    assert reader_examples({"protocol": "recite", "recite_chars": 100}) is None


def params_sidecar(argv: list[str], **results) -> dict:
    """A params sidecar's config and run record, as run.py writes them for the command `argv`."""
    return {"config": asdict(run.resolved_config(argv)), **results}


def test_gpu_check_records_the_pretrainings_order_decay_compilation_and_step_time_from_its_sidecar(tmp_path):
    sidecar = tmp_path / "pretrain.params.json"
    argv = ["pretrain", "vanilla", "wiki.txt", "--preset", "handout", "--compile"]
    sidecar.write_text(json.dumps(params_sidecar(argv, steps=400, train_seconds=2.0)))
    found = gpu_check.trainer_settings(sidecar)
    assert found == {"order": "file", "decay": "all_but_biases", "compiled": True, "ms_per_step": 5.0}


# ---------------------------------------------------------------------------
# The TensorBoard log


def log_epochs(folder: Path, epochs: range) -> None:
    """A trainer's TensorBoard log: one train/epoch_seconds per finished epoch, at the epoch's number."""
    writer = SummaryWriter(str(folder))
    for epoch in epochs:
        writer.add_scalar("train/loss", 2.0, epoch * 10)
        writer.add_scalar("train/epoch_seconds", 1.5, epoch)
    writer.close()


def test_the_epochs_done_are_those_of_the_last_epoch_time_logged(tmp_path):
    log_epochs(tmp_path / "run_vanilla_seed0_20261127-120000", range(1, 4))
    assert LoggedEpochs(tmp_path, "run_vanilla_seed0", since=0.0)() == 3


def test_the_epochs_done_follow_the_log_as_it_grows(tmp_path):
    folder = tmp_path / "run_vanilla_seed0_20261127-120000"
    log_epochs(folder, range(1, 3))
    epochs_done = LoggedEpochs(tmp_path, "run_vanilla_seed0", since=0.0)
    assert epochs_done() == 2
    log_epochs(folder, range(3, 6))  # a second event file, as a resumed run writes
    assert epochs_done() == 5


def test_no_epochs_are_done_before_the_run_logs_one(tmp_path):
    assert LoggedEpochs(tmp_path, "run_vanilla_seed0", since=0.0)() == 0
    SummaryWriter(str(tmp_path / "run_vanilla_seed0_20261127-120000")).close()  # started, no epoch finished
    assert LoggedEpochs(tmp_path, "run_vanilla_seed0", since=0.0)() == 0


def test_the_logs_of_earlier_runs_are_not_counted(tmp_path):
    earlier = tmp_path / "run_vanilla_seed0_20261126-120000"
    log_epochs(earlier, range(1, 10))
    os.utime(earlier, (time.time() - 3600, time.time() - 3600))
    assert LoggedEpochs(tmp_path, "run_vanilla_seed0", since=time.time() - 60)() == 0


def test_the_tensorboard_prefix_names_the_folders_run_py_writes():
    argv = ["pretrain", "rope", "wiki.txt", "--seed", "3", "--tb_expt_name", "budget_alone"]
    prefix = tensorboard_prefix(argv)
    assert prefix == "budget_alone_rope_pretrain_seed3"
    assert logs.run_folder(run.resolved_config(argv)).name.startswith(f"{prefix}_")


# ---------------------------------------------------------------------------
# bench_epoch.py: a step's price on this machine


def bench_epoch_row(corpus: Path, out: Path, monkeypatch, *flags: str) -> dict:
    """The one row `bench_epoch.py` appends to `out` for a tiny vanilla model and two timed steps (the matmul
    peaks, 2 s each, at a fixed rate: their timing has its own test below)."""
    monkeypatch.setattr(bench_epoch.research, "matmul_gflops", lambda *args, **kwargs: 100.0)
    tiny = ["--variants", "vanilla", "--steps", "2", "--warmup", "1", "--n_layer", "2", "--n_head", "2"]
    argv = [*tiny, "--n_embd", "16", "--peak_n", "128", "--corpus", str(corpus), "--out", str(out), *flags]
    assert bench_epoch.main(argv) == 0
    (row,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return row


def test_bench_epoch_records_parts_that_share_the_step_and_the_mfu_as_achieved_over_peak(
    tiny_corpus, tmp_path, monkeypatch
):
    row = bench_epoch_row(tiny_corpus, tmp_path / "speed.jsonl", monkeypatch)
    assert row["bench"] == "epoch" and row["variant"] == "vanilla" and row["steps"] == 2
    assert set(row["parts"]) == {"forward", "backward", "optimizer", "data", "other"}
    assert sum(part["share"] for part in row["parts"].values()) == pytest.approx(1.0)
    assert sum(part["seconds"] for part in row["parts"].values()) == pytest.approx(row["seconds_per_step"])
    assert row["achieved_gflops"] == pytest.approx(row["model_gflop_per_step"] / row["seconds_per_step"])
    assert row["mfu"] == pytest.approx(row["achieved_gflops"] / row["peak_gflops"])
    assert row["optimizer_gflop_per_step"] > 0  # the cpu preset's Muon iterates on the blocks' matrices
    for key in ("cpu", "cpu_name", "threads", "torch", "date", "command", "commit", "positions_per_step"):
        assert key in row


def test_bench_epoch_times_the_handout_step_on_micro_batches_that_leave_padding_out(tiny_corpus, tmp_path, monkeypatch):
    row = bench_epoch_row(tiny_corpus, tmp_path / "speed.jsonl", monkeypatch, "--preset", "handout", "--batch_size",
                          "8", "--micro_batch", "2")  # fmt: skip
    assert (row["order"], row["optimizer"], row["micro_batch"]) == ("file", "adamw", 2)
    assert row["target_positions_per_step"] <= row["positions_per_step"] < row["padded_positions_per_step"]
    assert row["optimizer_gflop_per_step"] == 0  # AdamW: no Newton–Schulz iteration


# ---------------------------------------------------------------------------
# The matmul peak


def test_the_matmul_peak_shrinks_a_product_too_slow_for_its_time_bound_and_says_the_shape_timed(capsys):
    # No CPU multiplies 2048^3 in a millisecond, a tenth of this bound: the sides are halved until one product fits.
    assert research.matmul_gflops(2048, 2048, 2048, torch.float32, seconds=0.01) > 0
    said = capsys.readouterr().err
    assert said.startswith("timing a (") and "(2048, 2048)" not in said and "for about 0.01 s" in said


# ---------------------------------------------------------------------------
# Hostile flag values: bench_scaling.py, plot_scaling.py and gpu_check.py refuse each in one line on stderr, exit
# code 2, before any measuring, with nothing written. Each flag is classified in BENCH_KINDS (as in
# test_hostile_suite.py); each numeric flag gets NUMBERS and each path flag PATHS of its kind, unless ALLOWED says why
# the value is legitimate.

BENCH_KINDS = {
    "bench_scaling.py": {
        "lengths": "int", "tokens": "int", "bottleneck_dim": "int", "warmup": "int", "steps": "int", "n_layer": "int",
        "n_head": "int", "n_embd": "int", "peak_n": "int", "point_budget": "float", "max_point_seconds": "float",
        "point_timeout": "float", "memory_fraction": "float", "out": "output", "variants": "choice",
        "device": "choice", "fp32": "switch", "no_record": "switch", "quick": "switch", "point": "internal",
    },
    "plot_scaling.py": {"rows": "input", "out": "figure", "machine": "text", "precision": "choice", "quick": "switch"},
    "gpu_check.py": {
        "seeds": "int", "deadline_minutes": "float", "workdir": "output_dir", "results": "output",
        "variants": "choice", "tiny": "switch", "skip_tests": "switch", "skip_speed": "switch", "compile": "choice",
        "fp32": "switch", "no_recite": "switch",
    },
}  # fmt: skip
WORK = {"bench_scaling.py": (bench_scaling, "measure"), "plot_scaling.py": (plot_scaling, "draw"),
        "gpu_check.py": (gpu_check, "run_check")}  # fmt: skip
NUMBERS = ["nan", "inf", "-1", "0", str(10**12)]
TOO_LONG = {"a name too long": "n" * 300, "a path too long": "/".join(["d" * 250] * 17)}
PATHS = {  # kind -> {hostile value's name: the path given, in the folder `hostile_folder` makes}
    "input": {"a folder": "folder", "a missing file": "missing.jsonl", "a FIFO": "fifo", "/dev/null": "/dev/null",
              "a path through a regular file": "regular.txt/x", "a symlink to a folder": "link_to_folder",
              "a dangling symlink": "dangling"},
    "output": {"a folder": "folder", "a file in a missing folder": "nowhere/x.jsonl", "a FIFO": "fifo",
               "/dev/null": "/dev/null", "a path through a regular file": "regular.txt/x",
               "a symlink to /dev/null": "link_to_null", "a symlink to a folder": "link_to_folder",
               "a dangling symlink into a missing folder": "dangling"},
    "figure": {"a folder": "folder.png", "a file in a missing folder": "nowhere/x.png", "a FIFO": "fifo.png",
               "/dev/null": "/dev/null", "a path through a regular file": "regular.txt/x.png",
               "a symlink to /dev/null": "null.png", "no extension": "figure", "an extension not drawn": "figure.txt"},
    "output_dir": {"a regular file": "regular.txt", "a FIFO": "fifo", "/dev/null": "/dev/null",
                   "a path through a regular file": "regular.txt/x", "a symlink to a regular file": "link_to_file"},
}  # fmt: skip
PATHS = {kind: {**values, **TOO_LONG, "an empty path": ""} for kind, values in PATHS.items()}
ALLOWED = {
    ("bench_scaling.py", "warmup", str(10**12)): "--point_budget caps the steps a point runs",
    ("bench_scaling.py", "steps", str(10**12)): "--point_budget caps the steps a point runs",
    ("bench_scaling.py", "point_budget", str(10**12)): "a cap: --steps bounds the timed steps",
    ("bench_scaling.py", "max_point_seconds", str(10**12)): "no length is skipped for its time",
    ("gpu_check.py", "seeds", "0"): "seeds are 0..2**32-1",
}


class PastChecks(BaseException):  # not an Exception: no `except Exception` of a script may take it
    """Raised where a script starts its work: its checks let the value through."""


def past_checks(*args, **kwargs):
    raise PastChecks


class Captured(Exception):
    """Carries the parser a script built, caught as it starts parsing."""


def script_parser(script: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser `script` builds inline, caught at its parse_args."""

    def capture(self, *args, **kwargs):
        raise Captured(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", capture)
        parse = {"bench_scaling.py": bench_scaling.parse, "plot_scaling.py": plot_scaling.main,
                 "gpu_check.py": gpu_check.parse}[script]  # fmt: skip
        with pytest.raises(Captured) as caught:
            parse([])
    return caught.value.args[0]


@pytest.mark.parametrize("script", sorted(BENCH_KINDS))
def test_every_flag_of_each_bench_script_is_classified(script, monkeypatch):
    parser = script_parser(script, monkeypatch)
    flags = {a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction)}
    assert flags == set(BENCH_KINDS[script]), f"{script}: classify its flags in BENCH_KINDS"


def one_line_refusal(err: str) -> bool:
    """Whether `err` is one line: "error: ..." or argparse's usage mistake, "<prog>: error: ..."."""
    lines = err.strip().splitlines()
    return len(lines) == 1 and re.match(r"(\S+: )?error: ", lines[0]) is not None


def scaling_rows_file(path: Path) -> Path:
    """A scaling.jsonl of one quick run: vanilla at T = 32 and 64, measured."""
    row = {"bench": "scaling", "run": "2026-11-28T10:00:00", "date": "2026-11-28 10:00", "precision": "fp32",
           "machine": {"label": "a CPU"}, "quick": False, "tokens": 512, "peak_gflops": 100.0, "variant": "vanilla"}  # fmt: skip
    rows = [
        {**row, "T": T, "batch": 512 // T, "seconds": 0.01 * T, "flops": 1e6 * T, "step_peak_bytes": T}
        for T in (32, 64)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bench_inputs(tmp_path_factory) -> Path:
    """Valid inputs of the three scripts, outside the folder each case runs in: rows to draw, the data files."""
    d = tmp_path_factory.mktemp("bench_inputs")
    scaling_rows_file(d / "scaling.jsonl")
    (d / "data").mkdir()
    for name in gpu_check.DATA_FILES:
        (d / "data" / name).write_text("Where was Ada Lovelace born?\tLondon\n", encoding="utf-8")
    return d


@pytest.fixture
def hostile_folder(tmp_path, monkeypatch):
    """The folder a case runs in, holding what hostile paths name: folders, FIFOs, a regular file, symlinks."""
    monkeypatch.chdir(tmp_path)
    for folder in ("folder", "folder.png"):
        (tmp_path / folder).mkdir()
    for fifo in ("fifo", "fifo.png"):
        os.mkfifo(tmp_path / fifo)
    (tmp_path / "regular.txt").write_text("a file\n")
    for link, target in (("link_to_folder", "folder"), ("link_to_null", "/dev/null"), ("null.png", "/dev/null"),
                         ("dangling", "nowhere/x"), ("link_to_file", "regular.txt")):  # fmt: skip
        os.symlink(target, tmp_path / link)
    return tmp_path


def base_argv(script: str, inputs: Path) -> list[str]:
    """A command line of `script` that passes its checks, writing (were it let) in the current folder."""
    return {
        "bench_scaling.py": ["--quick", "--out", "scaling.jsonl"],
        "plot_scaling.py": ["--rows", str(inputs / "scaling.jsonl"), "--out", "scaling.png"],
        "gpu_check.py": ["--tiny", "--workdir", "work", "--results", "gpu.jsonl", "--skip_tests", "--skip_speed"],
    }[script]


def attempt(script: str, argv: list[str], inputs: Path, monkeypatch) -> int | str:
    """`script` run with `argv`: its exit code, or "past its checks" where it started its work."""
    module, work = WORK[script]
    monkeypatch.setattr(module, work, past_checks)
    monkeypatch.setattr(gpu_check, "DATA", inputs / "data")
    monkeypatch.delenv("GPU_CHECK_TINY", raising=False)
    try:
        return module.main(argv)
    except PastChecks:
        return "past its checks"


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def hostile_cases() -> list:
    found = []
    for script, kinds in BENCH_KINDS.items():
        for flag, kind in kinds.items():
            values = {v: v for v in NUMBERS} if kind in ("int", "float") else PATHS.get(kind, {})
            found += [pytest.param(script, flag, name, value, id=f"{script} {flag} {name}")
                      for name, value in values.items()]  # fmt: skip
    return found


@pytest.mark.parametrize(("script", "flag", "name", "value"), hostile_cases())
def test_a_hostile_bench_flag_value_is_refused_in_one_line_before_any_work(
    script, flag, name, value, bench_inputs, hostile_folder, monkeypatch, capsys
):
    before = tree(hostile_folder)
    result = attempt(script, [*base_argv(script, bench_inputs), f"--{flag}", value], bench_inputs, monkeypatch)
    err = capsys.readouterr().err
    reason = ALLOWED.get((script, flag, value))
    if reason is not None:
        assert result == "past its checks", f"allowed ({reason}), but refused: {err}"
        return
    assert result == 2, f"{script} --{flag} {value!r}: {result}, not refused\n{err}"
    assert one_line_refusal(err), err
    assert tree(hostile_folder) == before


def test_the_base_command_lines_pass_the_checks(bench_inputs, hostile_folder, monkeypatch):
    for script in BENCH_KINDS:
        assert attempt(script, base_argv(script, bench_inputs), bench_inputs, monkeypatch) == "past its checks"


@pytest.mark.parametrize("script", sorted(BENCH_KINDS))
def test_a_script_run_as_a_command_refuses_a_bad_value_in_one_line(script, tmp_path):
    argv = {"bench_scaling.py": ["--lengths", "0"], "plot_scaling.py": ["--out", str(tmp_path / "x.txt")],
            "gpu_check.py": ["--tiny", "--deadline_minutes", "nan"]}[script]  # fmt: skip
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / script), *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 2 and one_line_refusal(done.stderr), done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# bench_scaling.py: the flags' rules, checked before anything is measured


def scaling(argv: list[str], monkeypatch, capsys) -> tuple[int | str, str]:
    """bench_scaling.py run with `argv` and --no_record unless --out is given: its exit code (or "past its
    checks") and what it said on stderr."""
    monkeypatch.setattr(bench_scaling, "measure", past_checks)
    try:
        result = bench_scaling.main(argv if "--out" in argv else [*argv, "--no_record"])
    except PastChecks:
        result = "past its checks"
    return result, capsys.readouterr().err


@pytest.mark.parametrize("length", ["0", "-32"])
def test_bench_scaling_refuses_a_length_below_1(length, monkeypatch, capsys):
    result, err = scaling(["--lengths", length], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and f"--lengths must each be at least 1, got {length}" in err


def test_bench_scaling_refuses_no_timed_steps(monkeypatch, capsys):
    result, err = scaling(["--steps", "0"], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--steps must be at least 1" in err


def test_bench_scaling_refuses_heads_that_do_not_divide_the_width_instead_of_skipping_every_point(monkeypatch, capsys):
    result, err = scaling(["--n_head", "3"], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--n_embd 256 must be divisible by --n_head 3" in err


def test_bench_scaling_refuses_a_peak_matmul_of_side_0(monkeypatch, capsys):
    result, err = scaling(["--peak_n", "0"], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--peak_n must be at least 1" in err


def test_bench_scaling_refuses_cuda_on_a_machine_without_it(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result, err = scaling(["--device", "cuda"], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "no CUDA GPU is available" in err


def test_bench_scaling_refuses_a_device_it_does_not_know(monkeypatch, capsys):
    result, err = scaling(["--device", "tpu"], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "invalid choice: 'tpu'" in err


@pytest.mark.parametrize("fraction", ["nan", "inf", "0", "-0.5", "1.5"])
def test_bench_scaling_takes_a_memory_fraction_above_0_and_at_most_1(fraction, monkeypatch, capsys):
    result, err = scaling(["--memory_fraction", fraction], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--memory_fraction must be above 0 and at most 1" in err


def test_bench_scaling_refuses_a_length_named_twice(monkeypatch, capsys):
    result, err = scaling(["--lengths", "128", "128"], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--lengths names a value twice" in err


def test_bench_scaling_refuses_a_variant_that_fits_at_none_of_the_lengths(monkeypatch, capsys):
    monkeypatch.setattr(utils, "physical_memory", lambda: 16e9)
    result, err = scaling(["--variants", "vanilla", "--device", "cpu", "--lengths", "16384"], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "vanilla fits at none of --lengths: T=16384" in err


def test_bench_scaling_measures_the_lengths_in_ascending_order(monkeypatch):
    measured = []

    def measure(args, record):
        measured.extend(args.lengths)
        raise PastChecks

    monkeypatch.setattr(bench_scaling, "measure", measure)
    with pytest.raises(PastChecks):
        bench_scaling.main(["--lengths", "512", "128", "256", "--no_record"])
    assert measured == [128, 256, 512]


def test_bench_scaling_refuses_an_out_that_is_a_folder_before_measuring(tmp_path, monkeypatch, capsys):
    for measuring in ("matmul_gflops", "count_flops"):
        monkeypatch.setattr(bench_scaling.research, measuring, past_checks)
    monkeypatch.setattr(bench_scaling.policy, "choose", past_checks)
    assert bench_scaling.main(["--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert one_line_refusal(err) and f"--out {tmp_path}: is a folder" in err


def test_bench_scaling_refuses_a_read_only_out(tmp_path, monkeypatch, capsys):
    out = tmp_path / "scaling.jsonl"
    out.write_text("", encoding="utf-8")
    out.chmod(0o444)  # refused for a user; root passes it, so os.access answers as for a user
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != out and real_access(p, mode, **kw))
    result, err = scaling(["--quick", "--out", str(out)], monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "cannot be read and written" in err


def test_a_damaged_machine_cache_entry_is_measured_over_by_machine_measured(tmp_path, monkeypatch, capsys):
    # bench_scaling.py decides the precision by machine.choose, whose cache reader refuses a rate that is no number.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cpu = torch.device("cpu")
    cache = machine.cache_path()
    cache.parent.mkdir(parents=True)
    damaged = {"bf16_gflops": "fast", "fp32_gflops": 10.0, "split_cost": 1.0, "date": "2026-11-28"}
    cache.write_text(json.dumps({machine.machine_key(cpu): damaged}), encoding="utf-8")
    monkeypatch.setattr(machine, "_decided", {}, raising=False)  # this process decided nothing yet
    monkeypatch.setattr(machine, "measure", lambda device: machine.Measured(5.0, 20.0, 1.0, "2026-11-28"))
    monkeypatch.setattr(bench_scaling.research, "matmul_gflops", lambda *a, **k: 100.0)
    monkeypatch.setattr(bench_scaling, "run_point_in_child", lambda p, timeout: {"skipped": "not run here"})
    out = tmp_path / "scaling.jsonl"
    argv = ["--quick", "--device", "cpu", "--variants", "vanilla", "--lengths", "32", "--out", str(out)]
    assert bench_scaling.main(argv) == 0
    (row,) = plot_scaling.read_rows(out)
    assert row["precision"] == "fp32"  # the measurement's: bf16 5 against fp32 20 GFLOP/s
    assert json.loads(cache.read_text(encoding="utf-8"))[machine.machine_key(cpu)]["bf16_gflops"] == 5.0


def test_a_row_is_added_to_the_rows_whole_after_those_there(tmp_path):
    out = tmp_path / "scaling.jsonl"
    out.write_text('{"bench": "epoch"}', encoding="utf-8")  # a last line without its newline
    bench_scaling.append_row(out, {"bench": "scaling", "T": 32})
    assert out.read_text(encoding="utf-8").splitlines() == ['{"bench": "epoch"}', '{"bench": "scaling", "T": 32}']


def test_a_row_that_cannot_be_written_leaves_the_rows_as_they_were(tmp_path):
    out = tmp_path / "scaling.jsonl"
    out.write_text('{"bench": "scaling"}\n', encoding="utf-8")
    with pytest.raises(TypeError):
        bench_scaling.append_row(out, {"bench": "scaling", "T": object()})  # not JSON: fails while writing
    assert out.read_text(encoding="utf-8") == '{"bench": "scaling"}\n'
    assert list(tmp_path.iterdir()) == [out]  # no temporary left beside it


# ---------------------------------------------------------------------------
# plot_scaling.py: the rows it reads and the figure it writes


def plot(argv: list[str], capsys) -> tuple[int, str]:
    result = plot_scaling.main(argv)
    return result, capsys.readouterr().err


def test_plot_refuses_a_row_that_is_not_json_naming_its_file_and_line(tmp_path, capsys):
    rows = scaling_rows_file(tmp_path / "scaling.jsonl")
    rows.write_text(rows.read_text(encoding="utf-8") + "{not json\n", encoding="utf-8")
    result, err = plot(["--rows", str(rows), "--out", str(tmp_path / "f.png")], capsys)
    assert result == 2 and one_line_refusal(err) and f"{rows}:3: not a JSON object" in err
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize("line", ["[1, 2]", "3", '"scaling"'])
def test_plot_refuses_a_row_that_is_json_but_no_object(line, tmp_path, capsys):
    rows = tmp_path / "scaling.jsonl"
    rows.write_text(line + "\n", encoding="utf-8")
    result, err = plot(["--rows", str(rows), "--out", str(tmp_path / "f.png")], capsys)
    assert result == 2 and one_line_refusal(err) and f"{rows}:1: not a JSON object" in err


@pytest.mark.parametrize("field", ["seconds", "T", "run", "peak_gflops", "machine"])
def test_plot_refuses_a_row_missing_a_field_naming_file_line_and_field(field, tmp_path, capsys):
    rows = scaling_rows_file(tmp_path / "scaling.jsonl")
    first, second = rows.read_text(encoding="utf-8").splitlines()
    broken = json.loads(second)
    del broken[field]
    rows.write_text(f"{first}\n{json.dumps(broken)}\n", encoding="utf-8")
    result, err = plot(["--rows", str(rows), "--out", str(tmp_path / "f.png")], capsys)
    assert result == 2 and one_line_refusal(err) and f"{rows}:2: field {field}" in err


@pytest.mark.parametrize("value", ["NaN", "Infinity", '"fast"', "-1", "true"])
def test_plot_refuses_a_seconds_that_is_no_positive_finite_number(value, tmp_path, capsys):
    rows = tmp_path / "scaling.jsonl"
    row = json.loads(scaling_rows_file(rows).read_text(encoding="utf-8").splitlines()[0])
    rows.write_text(json.dumps(row).replace('"seconds": 0.32', f'"seconds": {value}') + "\n", encoding="utf-8")
    result, err = plot(["--rows", str(rows), "--out", str(tmp_path / "f.png")], capsys)
    assert result == 2 and one_line_refusal(err) and f"{rows}:1: field seconds must be a number above 0" in err


def test_plot_refuses_an_extension_it_does_not_draw_and_names_those_it_does(bench_inputs, tmp_path, capsys):
    result, err = plot(["--rows", str(bench_inputs / "scaling.jsonl"), "--out", str(tmp_path / "x.txt")], capsys)
    assert result == 2 and one_line_refusal(err) and ".png, .pdf, .svg" in err and "'.txt'" in err
    assert list(tmp_path.iterdir()) == []


def test_plot_refuses_an_out_in_a_folder_without_write_permission(bench_inputs, tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)  # refused for a user; root passes it, so os.access answers as for a user
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != locked and real_access(p, mode, **kw))
    result, err = plot(["--rows", str(bench_inputs / "scaling.jsonl"), "--out", str(locked / "f.png")], capsys)
    assert result == 2 and one_line_refusal(err) and "is not writable" in err
    assert list(locked.iterdir()) == []


def test_plot_refuses_an_out_file_that_is_read_only(bench_inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "f.png"
    out.write_bytes(b"the previous figure")
    out.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != out and real_access(p, mode, **kw))
    result, err = plot(["--rows", str(bench_inputs / "scaling.jsonl"), "--out", str(out)], capsys)
    assert result == 2 and one_line_refusal(err) and "read-only" in err
    assert out.read_bytes() == b"the previous figure"


def test_plot_refuses_an_out_through_a_regular_file(bench_inputs, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine")
    result, err = plot(["--rows", str(bench_inputs / "scaling.jsonl"), "--out", str(tmp_path / "afile/f.png")], capsys)
    assert result == 2 and one_line_refusal(err) and "a path through something that is not a folder" in err
    assert (tmp_path / "afile").read_text() == "mine"


def test_plot_refuses_rows_with_no_matching_run(bench_inputs, tmp_path, capsys):
    argv = ["--rows", str(bench_inputs / "scaling.jsonl"), "--machine", "H200", "--out", str(tmp_path / "f.png")]
    result, err = plot(argv, capsys)
    assert result == 2 and one_line_refusal(err) and "no matching run" in err


def test_plot_refuses_a_run_whose_every_point_was_skipped(tmp_path, capsys):
    rows = tmp_path / "scaling.jsonl"
    row = json.loads(scaling_rows_file(rows).read_text(encoding="utf-8").splitlines()[0])
    skipped = {k: v for k, v in row.items() if k not in ("seconds", "flops", "step_peak_bytes")}
    rows.write_text(json.dumps({**skipped, "skipped": "needs about 99 GB"}) + "\n", encoding="utf-8")
    result, err = plot(["--rows", str(rows), "--out", str(tmp_path / "f.png")], capsys)
    assert result == 2 and one_line_refusal(err) and "every point of the run" in err


def test_a_figure_that_fails_while_written_leaves_the_previous_one(bench_inputs, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def full_disk(self, path, **kwargs):
        Path(path).write_bytes(b"half a PNG")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    out = tmp_path / "f.png"
    out.write_bytes(b"the previous figure")
    result, err = plot(["--rows", str(bench_inputs / "scaling.jsonl"), "--out", str(out)], capsys)
    assert result == 2 and one_line_refusal(err) and "previous file, if any, is intact" in err
    assert out.read_bytes() == b"the previous figure" and list(tmp_path.iterdir()) == [out]


# ---------------------------------------------------------------------------
# gpu_check.py: its flags, the machine, and the deadline


def gpu(argv: list[str], bench_inputs: Path, monkeypatch, capsys) -> tuple[int | str, str]:
    result = attempt("gpu_check.py", argv, bench_inputs, monkeypatch)
    return result, capsys.readouterr().err


def test_gpu_check_refuses_a_workdir_that_is_a_regular_file(bench_inputs, tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("mine")
    result, err = gpu(["--tiny", "--workdir", str(tmp_path / "afile")], bench_inputs, monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--workdir" in err and "is not a folder (a file)" in err
    assert (tmp_path / "afile").read_text() == "mine"


def test_gpu_check_without_cuda_refuses_the_handouts_runs_and_names_the_tiny_rehearsal(
    bench_inputs, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result, err = gpu(["--workdir", str(tmp_path / "work")], bench_inputs, monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "no CUDA GPU" in err and "--tiny" in err
    assert list(tmp_path.iterdir()) == []


def test_gpu_check_without_cuda_runs_the_tiny_rehearsal(bench_inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result, _ = gpu(["--tiny", "--workdir", str(tmp_path / "work")], bench_inputs, monkeypatch, capsys)
    assert result == "past its checks"


@pytest.mark.parametrize("minutes", ["nan", "inf", "0", "-1", "1e12"])
def test_gpu_check_takes_a_deadline_above_0_and_at_most_a_week(minutes, bench_inputs, tmp_path, monkeypatch, capsys):
    argv = ["--tiny", "--workdir", str(tmp_path / "work"), "--deadline_minutes", minutes]
    result, err = gpu(argv, bench_inputs, monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--deadline_minutes must be above 0 and at most" in err


def test_gpu_check_refuses_a_seed_named_twice(bench_inputs, tmp_path, monkeypatch, capsys):
    argv = ["--tiny", "--workdir", str(tmp_path / "work"), "--seeds", "0", "0"]
    result, err = gpu(argv, bench_inputs, monkeypatch, capsys)
    assert result == 2 and one_line_refusal(err) and "--seeds names a value twice" in err


def test_gpu_check_refuses_a_tiny_setting_other_than_0_or_1(bench_inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "run_check", past_checks)
    monkeypatch.setenv("GPU_CHECK_TINY", "yes")
    assert gpu_check.main(["--workdir", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert one_line_refusal(err) and "GPU_CHECK_TINY must be 1" in err


def sleeping_runs(tmp_path: Path, monkeypatch, ignore_sigterm: bool = False) -> list[gpu_check.Run]:
    """Two tiny runs whose run.py sleeps for a minute (ignoring SIGTERM if asked), started."""
    sleeper = tmp_path / "sleeper.py"
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_sigterm else ""
    sleeper.write_text(f"import signal, time\n{ignore}print('ready', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setattr(gpu_check, "RUN_PY", str(sleeper))
    monkeypatch.setattr(gpu_check, "POLL_SECONDS", 0.05)
    slots = gpu_check.Slots(2)
    runs = [gpu_check.Run(v, 0, tmp_path / v, True, {"dev": "dev.tsv", "test": "test.tsv"}, slots,
                          lambda r, protocol: None) for v in ("vanilla", "rope")]  # fmt: skip
    for r in runs:
        r.thread.start()
    first, started = runs[0], time.time()  # on a CPU the runs go one at a time: the first is running
    while first.proc is None or "ready" not in (first.folder / "pretrain.log").read_text():
        assert time.time() - started < 30, "the first run's command did not start"
        time.sleep(0.05)
    return runs


def test_gpu_check_stops_every_run_at_the_deadline(tmp_path, monkeypatch):
    runs = sleeping_runs(tmp_path, monkeypatch)
    t0 = time.time()
    gpu_check.supervise(runs, deadline=t0 + 0.5, tiny=True)
    assert time.time() - t0 < 10  # not the sleepers' minute
    assert all(r.stopped == "stopped at the deadline" and not r.thread.is_alive() for r in runs)
    assert all(r.proc is None or r.proc.poll() is not None for r in runs)


def test_gpu_check_kills_a_run_that_ignores_the_stop_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "KILL_AFTER", 0.5)
    runs = sleeping_runs(tmp_path, monkeypatch, ignore_sigterm=True)
    t0 = time.time()
    gpu_check.supervise(runs, deadline=t0 + 0.2, tiny=True)
    assert time.time() - t0 < 10
    assert all(not r.thread.is_alive() and (r.proc is None or r.proc.poll() is not None) for r in runs)


def test_the_speed_check_past_the_deadline_is_stopped(tmp_path, capsys):
    assert gpu_check.speed_check(tmp_path, True, torch.device("cpu"), deadline=time.time() - 1) == {}
    assert "stopped at the deadline" in capsys.readouterr().out


def test_the_cuda_tests_still_running_at_the_deadline_are_stopped_and_not_finished():
    tests = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.time()
    gpu_check.finish_tests(tests, deadline=t0 + 0.3)
    assert time.time() - t0 < 10 and tests.poll() is not None
    results = gpu_check.Results(None, {}, True, tests, {}, {})
    assert results.tests_passed() is None  # "not finished", not FAILED
