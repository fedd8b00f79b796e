"""Specification of mingpt-demo: the character dataset, the script end to end, and the notebook itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, real_data

DEMO_DIR = REPO_ROOT / "mingpt-demo"
NOTEBOOK = DEMO_DIR / "play_char.ipynb"
sys.path.insert(0, str(DEMO_DIR))

import play_char  # noqa: E402
from play_char import CharDataset, DemoConfig, make_datasets  # noqa: E402

SPEECH = """HAMLET:
O God, O God! How weary, stale, flat and unprofitable
Seem to me all the uses of this world!

HORATIO:
My lord, I came to see your father's funeral.

"""
TINY = dict(block_size=16, n_layer=1, n_head=2, n_embd=16, batch_size=4, max_iters=3, warmup_iters=1)
TINY_FLAGS = [f"--{k}={v}" for k, v in TINY.items()] + ["--print_every=1", "--sample_chars=20", "--threads=0"]


@pytest.fixture
def speech(tmp_path: Path) -> Path:
    path = tmp_path / "input.txt"
    path.write_text(SPEECH * 8, encoding="utf-8")
    return path


def test_targets_are_the_inputs_shifted_by_one_character():
    train_set, _ = make_datasets(SPEECH * 8, block_size=16, val_fraction=0.1)
    x, y = train_set[3]
    assert x.shape == y.shape == (16,)
    text = train_set.vocab.decode(x.tolist() + y[-1:].tolist())
    assert text == (SPEECH * 8)[3 * 16 : 4 * 16 + 1]
    assert torch.equal(x[1:], y[:-1])


def test_no_character_has_the_pad_id_the_loss_ignores():
    train_set, _ = make_datasets(SPEECH, block_size=16, val_fraction=0.0)
    assert train_set.ids.min() >= 2  # 0 = PAD (ignored by the loss), 1 = MASK, both unused
    assert train_set.vocab.decode(train_set.ids.tolist()) == SPEECH


def test_an_epoch_of_batches_has_len_windows_of_consecutive_characters():
    ds = CharDataset(SPEECH * 8, block_size=16, vocab=make_datasets(SPEECH, 16, 0.0)[0].vocab)
    batches = list(ds.epoch_batches(batch_size=5, rng=np.random.default_rng(0)))
    assert sum(len(x) for x, _ in batches) == len(ds)
    text = SPEECH * 8
    for x, y in batches:
        assert x.shape == y.shape and x.shape[1] == 16
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row_x, row_y in zip(x, y):
            window = ds.vocab.decode(row_x.tolist() + row_y[-1:].tolist())
            assert window in text


def test_validation_split_is_the_end_of_the_text():
    text = SPEECH * 8
    train_set, val_set = make_datasets(text, block_size=16, val_fraction=0.25)
    n_val = int(len(text) * 0.25)
    assert len(val_set.ids) == n_val and len(train_set.ids) == len(text) - n_val
    assert make_datasets(text, block_size=16, val_fraction=0.0)[1] is None


def test_greedy_generation_starts_with_the_prompt_and_is_deterministic():
    train_set, _ = make_datasets(SPEECH, block_size=16, val_fraction=0.0)
    model = play_char.make_model(DemoConfig(**TINY), train_set.vocab_size)
    device = torch.device("cpu")
    a = play_char.generate(model, train_set.vocab, "O God", 30, device, greedy=True)
    b = play_char.generate(model, train_set.vocab, "O God", 30, device, greedy=True)
    assert a == b and a.startswith("O God") and len(a) == 5 + 30  # bitwise by design: the same code on the same model


def test_script_trains_and_prints_the_loss_and_a_sample(speech):
    cmd = [sys.executable, str(DEMO_DIR / "play_char.py"), "--input", str(speech), *TINY_FLAGS]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "iter 3: loss" in result.stdout
    assert "trained 3 iterations" in result.stdout and "val loss" in result.stdout
    sample = result.stdout.split("--- sample")[1]
    assert "O God, O God!" in sample


def test_missing_input_is_a_one_line_error_naming_the_data_step(tmp_path, capsys):
    assert play_char.main(["--input", str(tmp_path / "nope.txt"), *TINY_FLAGS]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nope.txt" in err and "data/get_data.py" in err


def test_prompt_outside_the_vocabulary_fails_before_training(speech, capsys):
    assert play_char.main(["--input", str(speech), "--prompt", "Zounds", *TINY_FLAGS]) == 2
    out, err = capsys.readouterr()
    assert "'Z'" in err and "--prompt" in err and "iter" not in out


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--learning_rate", "nan"), ("--learning_rate", "-1"), ("--learning_rate", "inf"), ("--dropout", "1.5")]
    + [("--dropout", "nan"), ("--temperature", "nan"), ("--temperature", "inf"), ("--seed", "-1")]
    + [("--seed", str(2**40)), ("--max_iters", "-1"), ("--batch_size", "-3"), ("--threads", str(2**40))]
    + [("--max_iters", "0")],
)
def test_a_setting_no_run_can_use_is_a_one_line_error_before_training(speech, flag, value, capsys):
    assert play_char.main(["--input", str(speech), *TINY_FLAGS, flag, value]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"play_char.py: error: {flag} ") and err.count("\n") == 1
    assert out == ""


@pytest.mark.parametrize("bad", ["a folder", "not UTF-8"])
def test_an_input_that_is_not_a_text_file_is_a_one_line_error_naming_input(tmp_path, bad, capsys):
    path = tmp_path / "input.txt"
    if bad == "a folder":
        path.mkdir()
    else:
        path.write_bytes(SPEECH.encode() + b"\xff")
    assert play_char.main(["--input", str(path), *TINY_FLAGS]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: --input {path}: ") and err.count("\n") == 1 and "iter" not in out


def test_a_fifo_as_input_is_refused_without_opening_it(tmp_path):
    """A FIFO without a writer would block the read forever: the subprocess must end at once."""
    fifo = tmp_path / "input.txt"
    os.mkfifo(fifo)
    cmd = [sys.executable, str(DEMO_DIR / "play_char.py"), "--input", str(fifo), *TINY_FLAGS]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert (
        result.stderr
        == f"error: --input {fifo}: is a FIFO, not a regular file; run `python data/get_data.py` first, or pass --input FILE\n"
    )
    assert list(tmp_path.iterdir()) == [fifo]


def test_the_first_estimate_is_for_the_runs_iterations_at_the_pace_after_the_warm_up_step(capsys):
    on_batch_end = play_char.early_estimate(max_iters=20)
    seconds = 0.0
    for step, took in enumerate([30.0] + [0.5] * 19, start=1):  # a slow first step, then 0.5 s each
        seconds += took
        on_batch_end(SimpleNamespace(step=step, seconds=seconds))
    assert capsys.readouterr().out == "0.50 s per iteration after the first: about 40 s for 20 iterations\n"


def test_a_saved_model_samples_as_the_trained_one_did_without_training_or_text(speech, tmp_path, capsys):
    params = tmp_path / "demo.params"
    assert play_char.main(["--input", str(speech), *TINY_FLAGS, "--greedy", "--writing_params_path", str(params)]) == 0
    trained = capsys.readouterr().out
    assert f"wrote {params}" in trained and not list(tmp_path.glob("*.tmp"))
    argv = ["--input", str(tmp_path / "gone.txt"), "--reading_params_path", str(params), "--max_iters", "0"]
    assert play_char.main([*argv, "--sample_chars=20", "--greedy"]) == 0
    sampled = capsys.readouterr().out
    assert "iter" not in sampled and f"read from {params}" in sampled
    assert sampled.split("--- sample")[1] == trained.split("--- sample")[1]


@pytest.mark.parametrize("bad", ["the input", "a symlink to the input", "a folder", "a device"])
def test_writing_params_path_that_cannot_take_a_params_file_is_refused_before_training(speech, tmp_path, bad, capsys):
    target = {"the input": speech, "a folder": tmp_path, "a device": Path(os.devnull)}.get(bad, tmp_path / "link")
    if bad == "a symlink to the input":
        target.symlink_to(speech)
    before = speech.read_text()
    assert play_char.main(["--input", str(speech), *TINY_FLAGS, "--writing_params_path", str(target)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: --writing_params_path {target}") and err.count("\n") == 1
    assert out == "" and speech.read_text() == before


def test_reading_a_file_that_is_not_a_params_file_is_a_one_line_error(speech, capsys):
    assert play_char.main(["--input", str(speech), *TINY_FLAGS, "--reading_params_path", str(speech)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: --reading_params_path {speech}: ") and err.count("\n") == 1 and out == ""


def test_help_gives_each_setting_its_default_once(capsys):
    assert play_char.main(["--help"]) == 0
    flags = re.split(r"\s(?=--\w+[ ,=\n])", " ".join(capsys.readouterr().out.split("options:")[1].split()))
    assert len(flags) > 20 and all(flag.count("(default:") <= 1 for flag in flags)


def test_real_tiny_shakespeare_has_65_characters():
    text = play_char.load_text(real_data("tinyshakespeare/input.txt"))
    train_set, val_set = make_datasets(text, block_size=128, val_fraction=0.1)
    assert train_set.vocab_size == 65 + 2
    assert len(train_set) == (len(text) - int(len(text) * 0.1) - 1) // 128


def test_notebook_is_committed_without_outputs():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert any("parameters" in c.metadata.get("tags", []) for c in code)


def test_notebook_runs_top_to_bottom_on_a_tiny_config(speech):
    """Execute the notebook itself, with a tiny config injected after its parameters cell."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    tiny = ", ".join(f"{k}={v!r}" for k, v in {**TINY, "input": str(speech), "sample_chars": 30}.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(f"cfg = DemoConfig({tiny})"))
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(DEMO_DIR)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "3 iterations" in printed and "val loss" in printed
    assert printed.count("O God, O God!") >= 4  # the sample and the three other settings
