"""Specification of the command line: the handout's workflow end to end on tiny data, and bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PEOPLE, REPO_ROOT, TINY_MODEL, forward_terms, gpt_next_logits, greedy_lead, real_data, rounding

import run
from bench import course
from config import FUNCTIONS, RESUME_MUST_MATCH, RunConfig, time_budget
from dataset import MASK_CHAR, Vocabulary, read_questions
from decode import answer_limit
from model import VARIANTS, GPTConfig
from params import read_sidecar

RUN = [sys.executable, str(REPO_ROOT / "src" / "run.py")]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # expt/ and outputs land in the test's folder


def cli(*argv: str) -> int:
    return run.main([str(a) for a in argv])


def pretrain(variant: str, corpus: Path, out: str = "pt.params", steps: int = 3, *extra: str) -> int:
    return cli("pretrain", variant, corpus, "--writing_params_path", out, "--max_steps", steps, *TINY_MODEL, *extra)


def finetune(variant, corpus, tsv, out="ft.params", reading=None, steps=3, *extra):
    args = ["finetune", variant, corpus, "--writing_params_path", out, "--finetune_corpus_path", tsv]
    if reading:
        args += ["--reading_params_path", reading]
    return cli(*args, "--max_steps", steps, *TINY_MODEL, *extra)


def evaluate(variant, corpus, params, tsv, out, *extra):
    return cli(
        "evaluate", variant, corpus, "--reading_params_path", params, "--eval_corpus_path", tsv,
        "--outputs_path", out, *TINY_MODEL, *extra,
    )  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_pretrain_finetune_evaluate_writes_one_prediction_per_line(
    variant, tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys
):
    assert pretrain(variant, tiny_corpus) == 0
    assert finetune(variant, tiny_corpus, tiny_train_tsv, reading="pt.params") == 0
    assert evaluate(variant, tiny_corpus, "ft.params", tiny_dev_tsv, "dev.predictions") == 0
    lines = Path("dev.predictions").read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 + 1 and lines[-1] == ""
    assert "Correct: " in capsys.readouterr().out


def test_finetune_without_pretraining_runs(tiny_corpus, tiny_train_tsv):
    assert finetune("vanilla", tiny_corpus, tiny_train_tsv) == 0
    assert Path("ft.params").is_file() and Path("ft.params.json").is_file()


def test_evaluate_without_places_says_no_targets(tiny_corpus, tiny_train_tsv, tmp_path, capsys):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    questions = tmp_path / "test.tsv"
    questions.write_text("".join(f"Where was {n} born?\n" for n, _ in PEOPLE[:3]), encoding="utf-8")
    assert evaluate("vanilla", tiny_corpus, "ft.params", questions, "test.predictions") == 0
    assert (
        "Predictions written to test.predictions, what evaluate found to test.predictions.json; no targets provided"
        in capsys.readouterr().out
    )
    assert len(Path("test.predictions").read_text(encoding="utf-8").splitlines()) == 3


def test_blank_input_lines_get_blank_predictions(tiny_corpus, tiny_train_tsv, tmp_path):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    questions = tmp_path / "gaps.tsv"
    questions.write_text(
        "Where was Ada Lovelace born?\tLondon\n\nWhere was Niels Bohr born?\tCopenhagen", encoding="utf-8"
    )
    assert evaluate("vanilla", tiny_corpus, "ft.params", questions, "out.predictions") == 0
    lines = Path("out.predictions").read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""


@pytest.mark.parametrize("variant", VARIANTS)
def test_evaluate_predicts_exactly_what_the_courses_one_question_at_a_time_loop_predicts(
    variant, tiny_corpus, tiny_train_tsv
):
    finetune(variant, tiny_corpus, tiny_train_tsv, "ft.params", None, 40, "--batch_size", "4", "--finetune_lr", "3e-3")
    assert evaluate(variant, tiny_corpus, "ft.params", tiny_train_tsv, "ft.predictions") == 0
    side = read_sidecar("ft.params")
    theirs = course.CourseGPT(GPTConfig(**side["model"]))
    theirs.load_state_dict(torch.load("ft.params", weights_only=True))
    questions = [q.text for q in read_questions(tiny_train_tsv, require_place=True) if q]
    vocab = Vocabulary(list(side["vocab"])[2:])
    for question in questions:  # no near-ties, which the two loops' rounding could break differently
        prompt = vocab.encode(question + MASK_CHAR)
        lead = greedy_lead(gpt_next_logits(theirs), prompt, answer_limit(len(prompt), 128), stop=vocab.stoi[MASK_CHAR])
        assert lead > 4 * rounding(forward_terms(n_layer=2, n_embd=32, n_head=2, length=128))
    expected = course.predict(theirs, vocab, questions, torch.device("cpu"))
    predictions = Path("ft.predictions").read_text(encoding="utf-8").splitlines()
    assert predictions == expected
    assert len(set(predictions)) > 1 or predictions[0] != ""


def test_tensorboard_logs_hold_training_and_eval_scalars(tiny_corpus, tiny_train_tsv, tiny_dev_tsv):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    finetune("vanilla", tiny_corpus, tiny_train_tsv, steps=4)
    evaluate("vanilla", tiny_corpus, "ft.params", tiny_dev_tsv, "dev.p")
    (train_run,) = Path("expt/finetune").iterdir()
    acc = EventAccumulator(str(train_run)).Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tokens_seen", "train/epoch_seconds"} <= tags
    assert len(acc.Scalars("train/loss")) == 4
    (eval_run,) = Path("expt/evaluate").iterdir()
    assert "eval/accuracy" in EventAccumulator(str(eval_run)).Reload().Tags()["scalars"]


def test_the_tensorboard_folders_of_a_whole_pipeline_tell_its_steps_apart(tiny_corpus, tiny_train_tsv, tiny_dev_tsv):
    tb = ("--tb_dir", "expt/pipeline")
    pretrain("vanilla", tiny_corpus, "pt.params", 2, *tb)
    finetune("vanilla", tiny_corpus, tiny_train_tsv, "scratch.params", None, 2, *tb)
    finetune("vanilla", tiny_corpus, tiny_train_tsv, "ft.params", "pt.params", 2, *tb)
    finetune("vanilla", tiny_corpus, tiny_train_tsv, "reader.params", "pt.params", 2, "--recite", *tb)
    for params in ("scratch.params", "ft.params", "reader.params"):
        evaluate("vanilla", tiny_corpus, params, tiny_dev_tsv, f"{params}.dev", *tb)
    stem = tiny_dev_tsv.stem
    roles = {re.sub(r"_seed0_\d{8}-\d{6}(-\d+)?$", "", p.name) for p in Path("expt/pipeline").iterdir()}
    assert roles == {
        "run_vanilla_pretrain", "run_vanilla_finetune-scratch", "run_vanilla_finetune", "run_vanilla_reader",
        f"run_vanilla_evaluate-scratch-{stem}", f"run_vanilla_evaluate-direct-{stem}",
        f"run_vanilla_evaluate-recite-{stem}",
    }  # fmt: skip


def test_every_run_logs_its_resolved_config_as_hparams_beside_what_it_found(tiny_corpus, tiny_train_tsv, tiny_dev_tsv):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    finetune("vanilla", tiny_corpus, tiny_train_tsv, steps=2)
    evaluate("vanilla", tiny_corpus, "ft.params", tiny_dev_tsv, "dev.p")
    for command, found in (("finetune", "hparams/final_loss"), ("evaluate", "hparams/accuracy")):
        (folder,) = Path("expt", command).iterdir()
        acc = EventAccumulator(str(folder)).Reload()
        assert found in acc.Tags()["scalars"]
        plugin = acc.PluginTagToContent("hparams")
        assert b"finetune_lr" in b"".join(plugin.values())  # the config's keys are in the hparams session


# ---------------------------------------------------------------------------
# Bad input: one line on stderr, exit code 2, no traceback, nothing good overwritten


def one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err.strip()
    assert (err.startswith("error: ") or err.startswith("run.py")) and "\n" not in err and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


def test_missing_corpus_is_a_one_line_error(capsys):
    assert pretrain("vanilla", Path("no_such_wiki.txt")) == 2
    one_line_error(capsys, "no_such_wiki.txt", "not found")


def test_missing_finetune_corpus_is_a_one_line_error(tiny_corpus, capsys):
    assert finetune("vanilla", tiny_corpus, "missing.tsv") == 2
    one_line_error(capsys, "missing.tsv")


def test_training_with_muon_is_recorded_in_the_params_sidecar(tiny_corpus):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--optimizer", "muon") == 0
    sidecar = json.loads(Path("pt.params.json").read_text(encoding="utf-8"))
    assert sidecar["config"]["optimizer"] == "muon"


def test_a_time_budget_becomes_the_trainers_budget_in_seconds():
    args = resolved("pretrain", "vanilla", "wiki.txt", "--preset", "cpu", "--budget_minutes", "1.5")
    assert time_budget(args) == (90, True)


def test_micro_batches_are_refused_where_the_order_batches_by_length(tiny_corpus, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--preset", "cpu", "--micro_batch", "7") == 2
    one_line_error(capsys, "--micro_batch splits the handout's file order only; --preset cpu batches by length")


def test_the_sidecar_records_the_micro_batches_the_order_used(tiny_corpus):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--preset", "cpu") == 0
    assert read_sidecar("pt.params")["speed"]["micro_batch"] == 0  # a bucketed batch is cropped whole


def test_the_cpu_presets_finetune_from_scratch_plans_its_epochs_to_a_time_budget():
    args = resolved("finetune", "vanilla", "wiki.txt", "--preset", "cpu", "--budget_minutes", "3")
    assert time_budget(args) == (180, True)


def test_a_run_within_its_time_budget_records_its_training_time(tiny_corpus):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--budget_minutes", "60") == 0
    sidecar = json.loads(Path("pt.params.json").read_text(encoding="utf-8"))
    assert sidecar["config"]["budget_minutes"] == 60 and 0 < sidecar["train_seconds"] < 3600


def test_a_run_that_spends_its_budget_says_where_it_stopped(tiny_corpus, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 50, "--budget_minutes", "0.0001") == 0
    assert "the 0.0001-minute budget was spent at step 1, after epoch 1 of 650" in capsys.readouterr().out  # one batch


def test_a_time_budget_that_is_not_positive_is_a_one_line_error(tiny_corpus, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--budget_minutes", "0") == 2
    one_line_error(capsys, "--budget_minutes must be a positive number, got 0.0")


def test_the_cpu_preset_plans_its_epochs_to_the_budget_and_the_handout_cuts_off():
    cpu = resolved("pretrain", "vanilla", "wiki.txt", "--preset", "cpu", "--budget_minutes", "30")
    assert time_budget(cpu) == (1800, True)
    handout = resolved("pretrain", "vanilla", "wiki.txt", "--budget_minutes", "30")
    assert time_budget(handout) == (1800, False)


def test_malformed_finetune_line_names_file_and_line(tiny_corpus, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("Where was Ada Lovelace born?\tLondon\nWhere was Niels Bohr born? Copenhagen\n", encoding="utf-8")
    assert finetune("vanilla", tiny_corpus, bad) == 2
    one_line_error(capsys, "bad.tsv:2", "no tab")


def test_character_outside_vocabulary_names_file_and_line(tiny_corpus, tiny_train_tsv, tmp_path, capsys):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    bad = tmp_path / "odd.tsv"
    bad.write_text("Where was Ada Lovelace born?\tLondon\nWhere was Zoë born?\tQ\n", encoding="utf-8")
    assert evaluate("vanilla", tiny_corpus, "ft.params", bad, "x.p") == 2
    one_line_error(capsys, "odd.tsv:2", "'Z'")


def test_question_too_long_for_the_block_is_refused(tiny_corpus, tiny_train_tsv, tmp_path, capsys):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    bad = tmp_path / "long.tsv"
    bad.write_text("Where was " + "Ada " * 40 + "born?\n", encoding="utf-8")
    assert evaluate("vanilla", tiny_corpus, "ft.params", bad, "x.p") == 2
    one_line_error(capsys, "long.tsv:1", "characters")


def test_params_of_the_other_variant_are_refused(tiny_corpus, tiny_dev_tsv, capsys):
    pretrain("vanilla", tiny_corpus, "v.params")
    capsys.readouterr()
    assert evaluate("perceiver", tiny_corpus, "v.params", tiny_dev_tsv, "x.p") == 2
    one_line_error(capsys, "variant is 'vanilla'")


@pytest.mark.parametrize(("made", "asked"), [("rope", "vanilla"), ("vanilla", "rope")])
def test_rope_and_vanilla_params_refuse_each_other_in_one_line(made, asked, tiny_corpus, tiny_dev_tsv, capsys):
    pretrain(made, tiny_corpus, "made.params")
    capsys.readouterr()
    assert evaluate(asked, tiny_corpus, "made.params", tiny_dev_tsv, "x.p") == 2
    one_line_error(capsys, f"variant is {made!r}")


@pytest.mark.parametrize(("made", "asked"), [("rope", "vanilla"), ("vanilla", "rope")])
def test_rope_and_vanilla_params_refuse_each_other_even_without_sidecar(made, asked, tiny_corpus, tiny_dev_tsv, capsys):
    pretrain(made, tiny_corpus, "made.params")
    Path("made.params.json").unlink()
    capsys.readouterr()
    assert evaluate(asked, tiny_corpus, "made.params", tiny_dev_tsv, "x.p") == 2
    one_line_error(capsys, f"look like a {made} model")


def test_params_of_another_bottleneck_are_refused_even_without_sidecar(tiny_corpus, tiny_dev_tsv, capsys):
    pretrain("perceiver", tiny_corpus, "p.params", 3, "--bottleneck_dim", "16")
    Path("p.params.json").unlink()
    capsys.readouterr()
    assert evaluate("perceiver", tiny_corpus, "p.params", tiny_dev_tsv, "x.p", "--bottleneck_dim", "8") == 2
    one_line_error(capsys, "down_block.C")


def test_evaluate_builds_the_model_its_params_sidecar_describes(tiny_corpus, tiny_dev_tsv):
    pretrain("perceiver", tiny_corpus, "p.params", 3, "--bottleneck_dim", "16")
    args = ["--reading_params_path", "p.params", "--eval_corpus_path", tiny_dev_tsv, "--outputs_path", "x.p"]
    assert cli("evaluate", "perceiver", tiny_corpus, *args) == 0  # no sizes, no --bottleneck_dim


def test_params_of_another_bottleneck_than_the_one_typed_are_refused(tiny_corpus, tiny_dev_tsv, capsys):
    pretrain("perceiver", tiny_corpus, "p.params", 3, "--bottleneck_dim", "16")
    capsys.readouterr()
    assert evaluate("perceiver", tiny_corpus, "p.params", tiny_dev_tsv, "x.p", "--bottleneck_dim", "8") == 2
    one_line_error(capsys, "bottleneck_dim is 16, this run needs 8")


def test_the_params_sidecar_stores_the_model_config_as_used(tiny_corpus):
    pretrain("rope", tiny_corpus, "p.params", 2, "--dropout", "0.2")
    model = json.loads(Path("p.params.json").read_text(encoding="utf-8"))["model"]
    assert (model["variant"], model["n_embd"], model["n_layer"], model["attn_pdrop"]) == ("rope", 32, 2, 0.2)


def test_garbage_params_file_is_refused(tiny_corpus, tiny_dev_tsv, capsys):
    Path("junk.params").write_bytes(b"this is not a checkpoint")
    assert evaluate("vanilla", tiny_corpus, "junk.params", tiny_dev_tsv, "x.p") == 2
    one_line_error(capsys, "junk.params")


class RunsCode:
    def __reduce__(self):
        return (print, ("pwned",))


def test_params_file_that_would_run_code_is_refused(tiny_corpus, tiny_dev_tsv, capsys):
    with open("evil.params", "wb") as f:
        pickle.dump({"x": RunsCode()}, f)
    assert evaluate("vanilla", tiny_corpus, "evil.params", tiny_dev_tsv, "x.p") == 2
    captured = capsys.readouterr()
    assert "pwned" not in captured.out
    assert captured.err.startswith("error: ") and "evil.params" in captured.err


def test_failed_evaluation_leaves_an_existing_output_untouched(tiny_corpus, tmp_path, capsys):
    Path("good.predictions").write_text("kept\n")
    Path("junk.params").write_bytes(b"junk")
    dev = tmp_path / "d.tsv"
    dev.write_text("Where was Ada Lovelace born?\tLondon\n", encoding="utf-8")
    assert evaluate("vanilla", tiny_corpus, "junk.params", dev, "good.predictions") == 2
    assert Path("good.predictions").read_text() == "kept\n"


def test_missing_output_folder_is_refused_before_training(tiny_corpus, capsys):
    assert pretrain("vanilla", tiny_corpus, "no/such/dir/pt.params") == 2
    one_line_error(capsys, "does not exist")
    assert not Path("expt/pretrain").exists() or not any(Path("expt/pretrain").rglob("*.params"))


def test_a_corpus_that_is_a_fifo_is_refused_instead_of_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "wiki.fifo"
    os.mkfifo(fifo)
    proc = subprocess.run(
        RUN + ["pretrain", "vanilla", str(fifo), "--writing_params_path", "pt.params"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: pretrain_corpus_path {fifo}: is a FIFO, not a regular file"]


def test_an_output_that_is_a_device_is_refused_before_training(tiny_corpus, capsys):
    assert pretrain("vanilla", tiny_corpus, "/dev/null") == 2
    one_line_error(capsys, "--writing_params_path /dev/null: is a device, not a regular file")
    assert not Path("/dev/null.ckpt").exists()


def test_an_output_folder_without_write_permission_is_refused_before_training(tiny_corpus, monkeypatch, capsys):
    locked = Path("locked")
    locked.mkdir()
    locked.chmod(0o555)  # refused for a user; root passes it, so os.access answers as for a user
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: Path(p).resolve() != locked.resolve() and real_access(p, mode, **kw)
    )
    assert pretrain("vanilla", tiny_corpus, "locked/pt.params") == 2
    one_line_error(capsys, "--writing_params_path locked/pt.params", "is not writable")
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("text", ["5", "[1, 2]", '"vanilla"'])
def test_a_sidecar_that_is_not_a_json_object_is_a_one_line_error(tiny_corpus, tiny_dev_tsv, text, capsys):
    Path("x.params").write_bytes(b"params")
    Path("x.params.json").write_text(text)
    assert evaluate("vanilla", tiny_corpus, "x.params", tiny_dev_tsv, "x.p") == 2
    one_line_error(capsys, "x.params.json: not a params sidecar", "expected an object")


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_outside_0_to_2_to_the_32_is_a_one_line_error(tiny_corpus, seed, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--seed", seed) == 2
    one_line_error(capsys, f"--seed must be between 0 and {2**32 - 1}, got {seed}")


@pytest.mark.parametrize("name", ["../../../x", "a/b", ".", "..", ""])
def test_a_tensorboard_name_that_is_not_a_plain_name_is_a_one_line_error(tiny_corpus, name, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--tb_expt_name", name) == 2
    one_line_error(capsys, "--tb_expt_name must be a plain name")
    assert not Path("pt.params").exists()


@pytest.mark.parametrize("argv", [["pretrian", "vanilla", "wiki.txt"], ["pretrain", "vanila", "wiki.txt"]])
def test_unknown_mode_or_variant_is_one_line_and_exit_2(argv):
    proc = subprocess.run(RUN + argv, capture_output=True, text=True)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "invalid choice" in proc.stderr


def test_bare_data_name_is_found_in_data_folder(capsys):
    real_data("wiki.txt")
    assert run.locate_data("wiki.txt") == REPO_ROOT / "data" / "wiki.txt"
    run.check_args(resolved("pretrain", "vanilla", "wiki.txt", "--writing_params_path", "x.params"))
    assert "using" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# The London baseline


def test_london_baseline_scores_five_percent_on_the_real_dev_set(tmp_path):
    real_data("birth_dev.tsv")
    out = tmp_path / "london.dev.predictions"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "london_baseline.py"), "--eval_corpus_path", "birth_dev.tsv",
         "--outputs_path", str(out)],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Correct: 25.0 out of 500.0: 5.0%" in proc.stdout
    assert out.read_text().splitlines() == ["London"] * 500


def test_evaluate_refuses_predictions_onto_its_eval_corpus_and_leaves_it_intact(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys
):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    before = tiny_dev_tsv.read_text()
    capsys.readouterr()
    assert evaluate("vanilla", tiny_corpus, "ft.params", tiny_dev_tsv, tiny_dev_tsv) == 2
    one_line_error(capsys, "--outputs_path", "is the same file as --eval_corpus_path")
    assert tiny_dev_tsv.read_text() == before


def test_evaluate_refuses_predictions_onto_the_params_it_reads(tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    size = Path("ft.params").stat().st_size
    capsys.readouterr()
    assert evaluate("vanilla", tiny_corpus, "ft.params", tiny_dev_tsv, "./ft.params") == 2
    one_line_error(capsys, "is the same file as --reading_params_path")
    assert Path("ft.params").stat().st_size == size


def test_evaluate_refuses_scores_onto_its_predictions(tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    assert evaluate("vanilla", tiny_corpus, "ft.params", tiny_dev_tsv, "p.tsv", "--scores_path", "p.tsv") == 2
    one_line_error(capsys, "--scores_path p.tsv is the same file as --outputs_path")


@pytest.mark.parametrize(
    "out, read", [("pt.params", "--reading_params_path"), ("pt.params.json", "--reading_params_path's sidecar")]
)
def test_finetune_refuses_to_write_over_the_pretrained_params_it_reads_or_their_sidecar(
    tiny_corpus, tiny_train_tsv, capsys, out, read
):
    assert pretrain("vanilla", tiny_corpus) == 0
    before = Path(out).read_bytes()
    capsys.readouterr()
    assert finetune("vanilla", tiny_corpus, tiny_train_tsv, out=out, reading="pt.params") == 2
    one_line_error(capsys, f"--writing_params_path {out} is the same file as {read}")
    assert Path(out).read_bytes() == before


def test_evaluate_refuses_predictions_onto_the_sidecar_of_the_params_it_reads(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys
):
    finetune("vanilla", tiny_corpus, tiny_train_tsv)
    before = Path("ft.params.json").read_bytes()
    capsys.readouterr()
    assert evaluate("vanilla", tiny_corpus, "ft.params", tiny_dev_tsv, "ft.params.json") == 2
    one_line_error(capsys, "--outputs_path ft.params.json is the same file as --reading_params_path's sidecar")
    assert Path("ft.params.json").read_bytes() == before


def test_finetune_refuses_a_params_name_whose_sidecar_is_its_question_file(tiny_corpus, tiny_train_tsv, capsys):
    questions = Path("ft.json")
    questions.write_bytes(tiny_train_tsv.read_bytes())
    assert finetune("vanilla", tiny_corpus, questions, out="ft") == 2
    one_line_error(capsys, "--writing_params_path's sidecar ft.json is the same file as --finetune_corpus_path")
    assert questions.read_bytes() == tiny_train_tsv.read_bytes()


def test_pretrain_refuses_to_write_params_over_its_corpus(tiny_corpus, capsys):
    before = tiny_corpus.read_text()
    assert pretrain("vanilla", tiny_corpus, str(tiny_corpus)) == 2
    one_line_error(capsys, "is the same file as the pretraining corpus")
    assert tiny_corpus.read_text() == before


def london(*argv: str) -> int:
    import london_baseline

    return london_baseline.main([str(a) for a in argv])


@pytest.mark.parametrize("spelling", ["same", "symlink", "other_path"])
def test_london_baseline_refuses_an_output_that_is_its_input_before_writing(tiny_dev_tsv, spelling, capsys):
    before = tiny_dev_tsv.read_text()
    out = {
        "same": tiny_dev_tsv,
        "symlink": Path("link.tsv"),
        "other_path": Path(f"../{tiny_dev_tsv.parent.name}/dev.tsv"),
    }
    if spelling == "symlink":
        out["symlink"].symlink_to(tiny_dev_tsv)
    assert london("--eval_corpus_path", tiny_dev_tsv, "--outputs_path", out[spelling]) == 2
    one_line_error(capsys, "is the same file as --eval_corpus_path")
    assert tiny_dev_tsv.read_text() == before


def test_london_baseline_refuses_a_folder_as_output(tiny_dev_tsv, capsys):
    Path("preds").mkdir()
    assert london("--eval_corpus_path", tiny_dev_tsv, "--outputs_path", "preds") == 2
    one_line_error(capsys, "--outputs_path preds: is a folder")


def test_london_baseline_with_a_missing_corpus_is_a_one_line_error(capsys):
    assert london("--eval_corpus_path", "no/such.tsv") == 2
    one_line_error(capsys, "--eval_corpus_path no/such.tsv: not found")


def test_london_baseline_without_its_corpus_flag_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        london("--outputs_path", "x.predictions")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--eval_corpus_path" in err


# ---------------------------------------------------------------------------
# Presets


def resolved(*argv: str) -> RunConfig:
    """The settings of run.py ARGV, resolved (config.resolve) but not checked."""
    typed = run.make_parser(argv[0]).parse_intermixed_args(list(argv[1:]))
    return run.resolve({"function": argv[0], **vars(typed)})


def test_handout_preset_is_the_default_and_holds_the_handouts_numbers():
    pre = resolved("pretrain", "vanilla", "wiki.txt")
    assert (pre.max_epochs, pre.batch_size, pre.pretrain_lr, pre.dropout) == (650, 128, 6e-3, 0.1)
    assert (pre.optimizer, pre.schedule) == ("adamw", "handout")
    fin = resolved("finetune", "vanilla", "wiki.txt", "--reading_params_path", "x")
    assert (fin.max_epochs, fin.batch_size, fin.finetune_lr) == (10, 256, 6e-4)
    assert resolved("finetune", "vanilla", "wiki.txt").max_epochs == 75


@pytest.mark.parametrize("function", ["pretrain", "finetune"])
def test_handout_preset_batches_in_file_order_and_decays_all_but_biases_as_the_handouts_trainer(function):
    args = resolved(function, "vanilla", "wiki.txt")
    assert (args.order, args.decay) == ("file", "all_but_biases")


def test_cpu_preset_batches_by_length_and_decays_matmul_weights_only():
    args = resolved("pretrain", "vanilla", "wiki.txt", "--preset", "cpu")
    assert (args.order, args.decay) == ("bucketed", "matmul")


def test_the_run_schedule_ends_its_cosine_at_the_floor_with_the_runs_last_step(tiny_corpus):
    assert resolved("pretrain", "vanilla", "wiki.txt", "--preset", "cpu").schedule == "run"
    assert pretrain("vanilla", tiny_corpus, "pt.params", 10**6, "--preset", "cpu", "--max_epochs", "90") == 0
    assert read_sidecar("pt.params")["final_lr"] == pytest.approx(0.1 * 1e-3)  # a tenth of the cpu preset's peak


def test_the_handout_schedule_ends_its_cosine_after_200_passes_over_the_pretraining_corpus(tiny_corpus):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 10**6, "--max_epochs", "90") == 0
    tokens, warmup, final = 90 * len(PEOPLE) * 127, 512 * 20, 200 * len(PEOPLE) * 128  # every batch holds them all
    cosine = 0.5 * (1 + math.cos(math.pi * (tokens - warmup) / (final - warmup)))
    assert read_sidecar("pt.params")["final_lr"] == pytest.approx(6e-3 * cosine)


def test_cpu_preset_finetunes_from_scratch_like_the_handout():
    args = resolved("finetune", "vanilla", "wiki.txt", "--preset", "cpu")
    assert (args.max_epochs, args.batch_size, args.finetune_lr, args.dropout) == (75, 256, 6e-4, 0.1)


def test_cpu_preset_pretrains_with_muon_at_batch_32_for_at_most_150_epochs_planned_to_60_minutes():
    args = resolved("pretrain", "vanilla", "wiki.txt", "--preset", "cpu")
    assert (args.optimizer, args.batch_size, args.pretrain_lr, args.max_epochs) == ("muon", 32, 1e-3, 150)
    assert (args.dropout, args.budget_minutes) == (0.0, 60)
    assert time_budget(args) == (3600, True)


def test_cpu_preset_finetunes_a_pretrained_model_for_5_epochs_at_1e_4_without_dropout():
    args = resolved("finetune", "vanilla", "wiki.txt", "--preset", "cpu", "--reading_params_path", "x")
    assert args.optimizer == "adamw"
    assert (args.max_epochs, args.batch_size, args.finetune_lr, args.dropout) == (5, 256, 1e-4, 0.0)


def test_cpu_preset_finetunes_a_recite_reader_like_the_handouts_finetune_so_that_it_learns_to_copy():
    args = resolved("finetune", "vanilla", "wiki.txt", "--preset", "cpu", "--reading_params_path", "x", "--recite")
    assert (args.max_epochs, args.batch_size, args.finetune_lr, args.dropout) == (10, 256, 6e-4, 0.1)


def test_an_explicit_reader_setting_wins_over_the_readers_preset():
    args = resolved("finetune", "vanilla", "wiki.txt", "--preset", "cpu", "--reading_params_path", "x", "--recite",
                    "--max_epochs", "5", "--dropout", "0")  # fmt: skip
    assert (args.max_epochs, args.finetune_lr, args.dropout) == (5, 6e-4, 0.0)


def test_an_explicit_optimizer_wins_over_every_preset():
    assert resolved("pretrain", "vanilla", "wiki.txt", "--optimizer", "muon").optimizer == "muon"
    assert resolved("pretrain", "vanilla", "wiki.txt", "--preset", "cpu", "--optimizer", "adamw").optimizer == "adamw"


def test_an_explicit_batch_order_and_decay_win_over_the_handout_preset():
    args = resolved("pretrain", "vanilla", "wiki.txt", "--order", "bucketed", "--decay", "matmul")
    assert (args.order, args.decay) == ("bucketed", "matmul")


@pytest.mark.parametrize(
    "command, groups",
    [("pretrain", ["the handout's:", "outputs:", "training:", "recipe:", "budget and checkpoints:", "speed:"]),
     ("evaluate", ["the handout's:", "outputs:", "training:", "recipe:", "budget and checkpoints:", "speed:"]),
     ("ask", ["the handout's:", "outputs:", "training:", "recipe:"])],
)  # fmt: skip
def test_each_commands_help_shows_its_own_flags_in_groups(command, groups):
    text = run.make_parser(command).format_help()
    assert sum(line.startswith("  -") for line in text.splitlines()) <= 26  # pretrain's 26th: --finetune_corpus_path
    for group in groups:
        assert group in text


def test_finetunes_help_lists_only_the_flags_finetune_takes():
    text = run.make_parser("finetune").format_help()
    assert "--finetune_corpus_path" in text and "--recite" in text and "--max_epochs" in text
    for other in ("--eval_corpus_path", "--outputs_path", "--pretrain_lr"):
        assert other not in text


@pytest.mark.parametrize(
    "command, flag, says",
    [("pretrain", "--max_epochs", "(handout: 650; cpu: 150)"),
     ("pretrain", "--budget_minutes", "(handout: none; cpu: 60)"),
     ("finetune", "--max_epochs", "(handout: 75 from scratch, 10 after pretraining, 10 recite reader; cpu: 75 from "
      "scratch, 5 after pretraining, 10 recite reader)"),
     ("finetune", "--batch_size", "(default 256)"),
     ("evaluate", "--n_embd", "(default 256)")],
)  # fmt: skip
def test_help_gives_each_flag_the_value_it_resolves_to_under_each_preset(command, flag, says):
    help_text = " ".join(run.make_parser(command).format_help().split())
    assert f"{flag} {flag[2:].upper()} " in help_text
    entry = help_text.split(f"{flag} {flag[2:].upper()} ", 1)[1]
    entry = entry[: re.search(r" --[a-z_]+ ([A-Z_]+|\{)", entry).start()]  # up to the next flag's entry
    assert says in entry


@pytest.mark.parametrize(
    "argv, message",
    [(["pretrain", "vanilla", "wiki.txt", "--eval_corpus_path", "d.tsv", "--outputs_path", "p"],
      "--eval_corpus_path is for evaluate, --outputs_path is for evaluate, not pretrain"),
     (["evaluate", "vanilla", "wiki.txt", "--writing_params_path", "x.params"],
      "--writing_params_path is for pretrain and finetune, not evaluate"),
     (["finetune", "vanilla", "wiki.txt", "--pretrain_lr", "0.5"], "--pretrain_lr is for pretrain, not finetune"),
     (["finetune", "vanilla", "wiki.txt", "--mix_share", "0.2", "--full_names"],
      "--mix_share is for pretrain, --full_names is for pretrain, not finetune"),
     (["evaluate", "vanilla", "wiki.txt", "--resume"], "--resume is for pretrain and finetune, not evaluate")],
)  # fmt: skip
def test_a_flag_of_another_command_is_refused_in_one_line(argv, message, capsys):
    assert cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err and not Path("expt").exists()


def test_resume_compares_the_settings_that_define_the_result_and_lets_outputs_budget_and_machine_change():
    assert {"variant", "pretrain_lr", "batch_size", "seed", "n_embd", "order"} <= set(RESUME_MUST_MATCH)
    free = {"writing_params_path", "outputs_path", "budget_minutes", "device", "resume", "fp32", "threads"}
    assert not free & set(RESUME_MUST_MATCH) and set(RESUME_MUST_MATCH) <= {
        f.name for f in dataclasses.fields(RunConfig)
    }


def test_every_flag_is_a_field_of_the_resolved_config():
    flags = {"function"} | {name for c in FUNCTIONS for name in vars(run.make_parser(c).parse_args(["vanilla", "x"]))}
    assert flags == {f.name for f in dataclasses.fields(RunConfig)}


def test_outputs_path_naming_a_folder_is_a_one_line_error(tiny_corpus, tiny_dev_tsv, capsys):
    pretrain("vanilla", tiny_corpus, "pt.params")
    Path("a_folder").mkdir()
    capsys.readouterr()
    assert evaluate("vanilla", tiny_corpus, "pt.params", tiny_dev_tsv, "a_folder") == 2
    one_line_error(capsys, "--outputs_path a_folder: is a folder")


@pytest.mark.parametrize("rate", ["-0.001", "0", "nan"])
def test_a_learning_rate_that_is_not_positive_is_a_one_line_error(tiny_corpus, rate, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--pretrain_lr", rate) == 2
    one_line_error(capsys, "--pretrain_lr must be a positive number")


def test_a_dropout_of_one_is_a_one_line_error(tiny_corpus, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--dropout", "1") == 2
    one_line_error(capsys, "--dropout must be between 0 and 0.99, got 1.0")


@pytest.mark.parametrize("question", ["", "   "])
def test_ask_with_an_empty_question_is_a_one_line_error(tiny_corpus, question, capsys):
    pretrain("vanilla", tiny_corpus, "pt.params")
    capsys.readouterr()
    assert cli("ask", "vanilla", tiny_corpus, question, "--reading_params_path", "pt.params", *TINY_MODEL) == 2
    one_line_error(capsys, "ask needs a question")


def test_an_unreadable_params_file_is_a_one_line_error_without_pytorchs_message(tiny_corpus, tiny_dev_tsv, capsys):
    pretrain("vanilla", tiny_corpus, "pt.params")
    data = Path("pt.params").read_bytes()
    Path("cut.params").write_bytes(data[: len(data) // 2])  # a half-written file
    capsys.readouterr()
    assert evaluate("vanilla", tiny_corpus, "cut.params", tiny_dev_tsv, "x.p") == 2
    err = one_line_error(capsys, "cut.params")
    assert "PytorchStreamReader" not in err and "zip" not in err


def test_params_sidecar_records_dropout(tiny_corpus):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2, "--dropout", "0.05") == 0
    sidecar = json.loads(Path("pt.params.json").read_text(encoding="utf-8"))
    assert sidecar["config"]["dropout"] == 0.05


def test_explicit_flags_win_over_the_preset():
    args = resolved(
        "pretrain", "perceiver", "wiki.txt", "--preset", "cpu", "--pretrain_lr", "1e-3", "--max_epochs", "3"
    )
    assert (args.pretrain_lr, args.max_epochs) == (1e-3, 3)


# ---------------------------------------------------------------------------
# Logs, checkpoints and time


def test_each_run_logs_to_its_own_tensorboard_folder_named_by_variant_role_seed_and_time(
    tiny_corpus, tiny_train_tsv, capsys
):
    assert finetune("vanilla", tiny_corpus, tiny_train_tsv, "a.params") == 0
    assert finetune("vanilla", tiny_corpus, tiny_train_tsv, "b.params", None, 3, "--seed", "7") == 0
    folders = sorted(p.name for p in Path("expt/finetune").iterdir())
    assert len(folders) == 2
    assert re.fullmatch(r"run_vanilla_finetune-scratch_seed0_\d{8}-\d{6}(-\d+)?", folders[0]), folders
    assert re.fullmatch(r"run_vanilla_finetune-scratch_seed7_\d{8}-\d{6}(-\d+)?", folders[1]), folders
    assert f"TensorBoard logs: {Path('expt/finetune') / folders[0]}" in capsys.readouterr().out


def test_a_failed_command_leaves_no_tensorboard_folder(tiny_corpus, tiny_dev_tsv, capsys):
    assert evaluate("vanilla", tiny_corpus, "missing.params", tiny_dev_tsv, "dev.p") == 2
    assert not Path("expt/evaluate").exists() or not any(Path("expt/evaluate").iterdir())


def test_a_finished_training_removes_its_checkpoint(tiny_corpus, tiny_train_tsv):
    args = ["finetune", "vanilla", tiny_corpus, "--writing_params_path", "ft.params"]
    assert cli(*args, "--finetune_corpus_path", tiny_train_tsv, "--max_epochs", 1, *TINY_MODEL) == 0
    assert Path("ft.params").is_file() and not Path("ft.params.ckpt").exists()


def test_a_run_stopped_by_max_steps_keeps_its_checkpoint_to_continue(tiny_corpus):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 2) == 0
    assert Path("pt.params.ckpt").is_file()


def test_the_handouts_recipe_on_a_cpu_says_early_what_it_costs_and_names_the_cpu_preset(tiny_corpus, capsys):
    assert pretrain("vanilla", tiny_corpus, "pt.params", 9, "--batch_size", 1) == 0  # 8 steps an epoch
    out = capsys.readouterr().out
    assert "note: the handout's recipe is made for a GPU" in out and "--preset cpu" in out
    assert re.search(r"at [\d.]+ s per epoch the 649 epochs left take about \d+ min", out)  # after the first epoch


def test_the_params_sidecar_says_where_the_params_came_from(tiny_corpus, tiny_train_tsv):
    assert pretrain("vanilla", tiny_corpus) == 0
    assert finetune("vanilla", tiny_corpus, tiny_train_tsv, "ft.params", "pt.params") == 0
    side = json.loads(Path("ft.params.json").read_text(encoding="utf-8"))
    assert (
        side["command"].startswith("python src/run.py finetune vanilla ") and "--reading_params_path" in side["command"]
    )
    assert side["parent_sha256"] == hashlib.sha256(Path("pt.params").read_bytes()).hexdigest()
    data = {str(tiny_corpus): tiny_corpus, str(tiny_train_tsv): tiny_train_tsv}
    assert side["data_sha256"] == {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in data.items()}
    assert side["commit"] is None or len(side["commit"].removesuffix("+changes")) == 40
    assert {"cpu", "device", "threads", "torch", "python"} <= set(side["machine"])
