"""bench/sweep.py: seeds x variants x protocols on a local Ray (127.0.0.1), at tiny sizes.

One sweep serves the tests that need Ray: vanilla seed 0, whose worker is killed during pretraining, and
rope seed 0, whose pretraining params path is a folder (a refusal, exit 2). Its cells are compared with the
same run.py commands run one by one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import DATA_DIR, REPO_ROOT

pytest.importorskip("ray")
pytestmark = pytest.mark.skipif(not (DATA_DIR / "wiki.txt").is_file(), reason="needs the data step's files")
sys.path.insert(0, str(REPO_ROOT / "bench"))

import sweep  # noqa: E402

TINY = "--n_layer 2 --n_head 2 --n_embd 16 --ckpt_every 4"
SWEEP = ["--preset", "handout", "--protocols", "direct", "--pretrain_epochs", "1", "--finetune_epochs", "1"]
SWEEP += [f"--extra={TINY}", "--cpus_per_run", "1"]
RUN = [sys.executable, "src/run.py"]
LIMIT = 300  # seconds: a sweep of two tiny cells takes well under a minute


def sweep_command(out: Path, *more: str) -> list[str]:
    return [sys.executable, "bench/sweep.py", *SWEEP, "--out", str(out), *more]


def cell_folder(out: Path, variant: str, seed: int = 0) -> Path:
    args = sweep.parse_args([*SWEEP, "--variants", variant, "--seeds", str(seed)])
    [cell] = sweep.make_cells(args, "handout")
    return out / cell.name


def attempts(folder: Path) -> list[str]:
    return (folder / "attempts.log").read_text().splitlines()


def run_one_by_one(out: Path) -> None:
    """vanilla seed 0's steps as run.sh runs them, one command after another, on one core as the cells are."""
    common = ["--preset", "handout", "--seed", "0", "--tb_dir", str(out / "tb"), *TINY.split()[:6]]
    training = [*common, "--max_epochs", "1", "--ckpt_every", "4"]
    pretrained, finetuned = str(out / "vanilla.pretrain.params"), str(out / "vanilla.finetune.params")
    evaluate = ["evaluate", "vanilla", "wiki.txt", "--reading_params_path", finetuned, *common]
    for argv in [
        ["pretrain", "vanilla", "wiki.txt", "--writing_params_path", pretrained, *training],
        ["finetune", "vanilla", "wiki.txt", "--reading_params_path", pretrained, "--writing_params_path", finetuned,
         "--finetune_corpus_path", "birth_places_train.tsv", *training],
        [*evaluate, "--eval_corpus_path", "birth_dev.tsv", "--outputs_path", str(out / "vanilla.pretrain.dev.predictions"),
         "--scores_path", str(out / "vanilla.pretrain.dev.scores.tsv")],
        [*evaluate, "--eval_corpus_path", "birth_test_inputs.tsv", "--outputs_path",
         str(out / "vanilla.pretrain.test.predictions")],
    ]:  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([*RUN, *argv], cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=LIMIT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, Path]:
    """The sweep (its vanilla worker killed once a pretraining checkpoint is on disk), and beside it on the
    other core the same cell's steps one by one: (the sweep's folder, its process, the one-by-one folder)."""
    out, alone = tmp_path_factory.mktemp("sweep") / "out", tmp_path_factory.mktemp("one_by_one")
    (cell_folder(out, "rope") / "rope.pretrain.params").mkdir(parents=True)
    vanilla = cell_folder(out, "vanilla")
    command = sweep_command(out, "--variants", "vanilla", "rope", "--seeds", "0")
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    beside = threading.Thread(target=run_one_by_one, args=(alone,))
    beside.start()
    deadline = time.monotonic() + LIMIT
    while not (vanilla / "vanilla.pretrain.params.ckpt").exists() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(int(attempts(vanilla)[0].split()[0]), signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=LIMIT)
    beside.join(timeout=LIMIT)
    return out, subprocess.CompletedProcess(command, proc.returncode, stdout, stderr), alone


@pytest.fixture(scope="module")
def swept(runs) -> tuple[Path, subprocess.CompletedProcess]:
    return runs[:2]


@pytest.fixture(scope="module")
def one_by_one(runs) -> Path:
    assert (runs[2] / "vanilla.pretrain.test.predictions").is_file()
    return runs[2]


def test_a_cells_predictions_equal_those_of_its_steps_run_one_by_one(swept, one_by_one):
    out, _ = swept
    for name in (
        "vanilla.pretrain.dev.predictions",
        "vanilla.pretrain.dev.scores.tsv",
        "vanilla.pretrain.test.predictions",
    ):
        assert (cell_folder(out, "vanilla") / name).read_bytes() == (one_by_one / name).read_bytes()


def test_a_worker_killed_during_pretraining_is_retried_resumes_and_gives_identical_params(swept, one_by_one):
    out, _ = swept
    vanilla = cell_folder(out, "vanilla")
    assert len(attempts(vanilla)) == 2
    assert "resuming from" in (vanilla / "vanilla_pretrain.log").read_text()
    for name in ("vanilla.pretrain.params", "vanilla.finetune.params"):
        mine, theirs = torch.load(vanilla / name), torch.load(one_by_one / name)
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_a_cell_refusing_its_input_fails_in_one_line_unretried_while_the_others_finish(swept):
    out, done = swept
    rope = cell_folder(out, "rope")
    assert done.returncode == 1
    [line] = [line for line in done.stderr.splitlines() if line.startswith("sweep:")]
    assert line.startswith(f"sweep: {rope.name} failed: step rope_pretrain (exit 2): error: --writing_params_path")
    assert len(attempts(rope)) == 1 and not (rope / "cell.json").exists()
    assert (cell_folder(out, "vanilla") / "cell.json").is_file()


def test_the_rows_and_tables_hold_each_finished_cell(swept):
    out, done = swept
    rows = (out / "rows.jsonl").read_text().splitlines()
    assert len(rows) == 1 and '"run": "vanilla"' in rows[0] and '"protocol": "direct"' in rows[0]
    assert "| vanilla | plain | direct | 1 | 0 |" in (out / "results.md").read_text()
    assert "| vanilla | plain | direct | 1 | 0 |" in done.stdout


def test_a_second_run_of_the_same_sweep_skips_the_finished_cells(swept):
    out, _ = swept
    vanilla = cell_folder(out, "vanilla")
    before = (vanilla / "cell.json").read_bytes()
    command = sweep_command(out, "--variants", "vanilla", "--seeds", "0")
    again = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=LIMIT)
    assert again.returncode == 0 and "sweep: all 1 cells already finished" in again.stdout
    assert len(attempts(vanilla)) == 2 and (vanilla / "cell.json").read_bytes() == before
    assert "| vanilla | plain | direct | 1 | 0 |" in again.stdout


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--seeds", "1", "1"], "--seeds: 1 is named twice"),
        (["--seeds", "-1"], "--seeds: -1 is not from 0"),
        (["--arm", "noflags"], "--arm 'noflags': give NAME=FLAGS"),
        (["--arm", "a=--dropout 0.1", "--arm", "a=--dropout 0.2"], "--arm: a is named twice"),
        (["--extra=--seed 3"], "--extra must not set --seed (--seed 3): give --seeds"),
        (["--arm", "x=--max_epochs 3"], "--arm x must not set --max_epochs"),
        (["--arm", "x=--dropout 2"], "--arm x --dropout 2:"),
        (["--extra=--nope"], "--extra --nope:"),
        (["--extra=--eval_corpus_path x.tsv"], "the sweep names the files"),
        (["--pretrain_epochs", "0"], "--pretrain_epochs must be at least 1"),
        (["--budget_minutes", "nan"], "--budget_minutes must be a positive number"),
        (["--record", "--pretrain_epochs", "1"], "--record records full cells of the plain recipe only"),
        (["--runs_per_gpu", "2"], "--runs_per_gpu: this machine has no GPU"),
        (["--arm", "m=--mix_share 0.2 --reading_params_path x.params"], "--arm m must not name a file"),
        (["--arm", "m=--mix_share 2"], "--mix_share must be between 0 and 0.99, got 2.0"),
    ],
)
def test_a_bad_setting_is_refused_in_one_line_before_any_cell_runs(tmp_path, capsys, flags, said):
    if flags == ["--runs_per_gpu", "2"] and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert sweep.main(["--out", str(tmp_path / "out"), "--variants", "vanilla", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sweep: ") and said in err[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("what", ["a file", "a symlink"])
def test_an_out_folder_that_is_not_a_folder_is_refused_and_left_as_it_was(tmp_path, capsys, what):
    out = tmp_path / "out"
    if what == "a file":
        out.write_text("mine")
    else:
        out.symlink_to(tmp_path / "elsewhere")
    assert sweep.main(["--out", str(out)]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert out.read_text() == "mine" if what == "a file" else out.is_symlink()


def test_a_recite_cell_runs_run_sh_s_reader_steps_with_its_file_names():
    args = sweep.parse_args(["--variants", "perceiver", "--protocols", "recite", "--preset", "cpu"])
    [cell] = sweep.make_cells(args, "cpu")
    steps = {s.name: s.argv for s in sweep.cell_steps(cell, "F")}
    assert list(steps) == ["perceiver_pretrain", "perceiver_reader", "perceiver_recite_dev", "perceiver_recite_test"]
    reader = steps["perceiver_reader"]
    assert "--recite" in reader and reader[reader.index("--writing_params_path") + 1] == "F/perceiver.reader.params"
    assert reader[reader.index("--bottleneck_dim") + 1] == "64"  # run.sh's m
    dev = steps["perceiver_recite_dev"]
    assert dev[dev.index("--outputs_path") + 1] == "F/perceiver.recite.dev.predictions"
    assert dev[dev.index("--scores_path") + 1] == "F/perceiver.recite.dev.scores.tsv"


def test_a_mixed_pretraining_arm_reads_the_questions_the_finetunes_read():
    args = sweep.parse_args(["--variants", "rope", "--arm", "mixed=--mix_share 0.2 --full_names", "--preset", "cpu"])
    [cell] = sweep.make_cells(args, "cpu")
    pretrain, finetune = (s.argv for s in sweep.cell_steps(cell, "F")[:2])
    assert pretrain[-5:] == ["--mix_share", "0.2", "--full_names", "--finetune_corpus_path", "birth_places_train.tsv"]
    assert finetune[finetune.index("--finetune_corpus_path") + 1] == "birth_places_train.tsv"
    assert "--mix_share" not in finetune and "--full_names" not in finetune


def test_ctrl_c_on_the_driver_stops_the_sweep_leaving_no_half_written_file(tmp_path):
    out = tmp_path / "out"
    command = sweep_command(out, "--variants", "vanilla", "--seeds", "0")
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint = cell_folder(out, "vanilla") / "vanilla.pretrain.params.ckpt"
    deadline = time.monotonic() + LIMIT
    while not checkpoint.exists() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=LIMIT)
    assert proc.returncode == 130
    assert [line for line in stderr.splitlines() if line.startswith("sweep:")] == [
        "sweep: interrupted; finished cells are recorded, and the same command continues the rest "
        "(a step resumes from its checkpoint)"
    ]
    assert not (out / "rows.jsonl").exists() and not (cell_folder(out, "vanilla") / "cell.json").exists()
