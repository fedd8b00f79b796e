"""Specification of what the bench scripts read from run.py's records: the predictions' and the params'
JSON sidecars and the TensorBoard log, never its printed lines."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import PEOPLE
from torch.utils.tensorboard import SummaryWriter

import logs
import run
from bench import bench_epoch, gpu_check, report, research
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


def bench_epoch_row(corpus: Path, out: Path, *flags: str) -> dict:
    """The one row `bench_epoch.py` appends to `out` for a tiny vanilla model and two timed steps."""
    tiny = ["--variants", "vanilla", "--steps", "2", "--warmup", "1", "--n_layer", "2", "--n_head", "2"]
    argv = [*tiny, "--n_embd", "16", "--peak_n", "128", "--corpus", str(corpus), "--out", str(out), *flags]
    assert bench_epoch.main(argv) == 0
    (row,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return row


def test_bench_epoch_records_parts_that_share_the_step_and_the_mfu_as_achieved_over_peak(tiny_corpus, tmp_path):
    row = bench_epoch_row(tiny_corpus, tmp_path / "speed.jsonl")
    assert row["bench"] == "epoch" and row["variant"] == "vanilla" and row["steps"] == 2
    assert set(row["parts"]) == {"forward", "backward", "optimizer", "data", "other"}
    assert sum(part["share"] for part in row["parts"].values()) == pytest.approx(1.0)
    assert sum(part["seconds"] for part in row["parts"].values()) == pytest.approx(row["seconds_per_step"])
    assert row["achieved_gflops"] == pytest.approx(row["model_gflop_per_step"] / row["seconds_per_step"])
    assert row["mfu"] == pytest.approx(row["achieved_gflops"] / row["peak_gflops"])
    assert row["optimizer_gflop_per_step"] > 0  # the cpu preset's Muon iterates on the blocks' matrices
    for key in ("cpu", "cpu_name", "threads", "torch", "date", "command", "commit", "positions_per_step"):
        assert key in row


def test_bench_epoch_times_the_handout_step_on_micro_batches_that_leave_padding_out(tiny_corpus, tmp_path):
    row = bench_epoch_row(tiny_corpus, tmp_path / "speed.jsonl", "--preset", "handout", "--batch_size", "8",
                          "--micro_batch", "2")  # fmt: skip
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
