"""Specification of long-run safety: resume, checkpoints, atomic files, determinism."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, TINY_MODEL
from test_trainer import tiny_people_dataset

import run
from model import GPT, GPTConfig
from trainer import Trainer, TrainerConfig
from utils import atomic_path, torch_load_safe

RUN = [sys.executable, str(REPO_ROOT / "src" / "run.py")]


def tiny_trainer(max_steps: int, ckpt: Path | None, optimizer: str = "adamw", variant: str = "vanilla") -> Trainer:
    random.seed(0)
    torch.manual_seed(0)
    ds = tiny_people_dataset()
    sizes = {"block_size": 32, "n_layer": 3, "n_head": 2, "n_embd": 16, "variant": variant, "bottleneck_dim": 16}
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, **sizes))
    cfg = TrainerConfig(
        max_epochs=4, batch_size=7, learning_rate=1e-2, warmup_tokens=50, final_tokens=5000,
        max_steps=max_steps, ckpt_path=str(ckpt) if ckpt else None, ckpt_every=0, optimizer=optimizer,
    )  # fmt: skip
    return Trainer(model, ds, cfg, torch.device("cpu"))


@pytest.mark.parametrize(
    ("variant", "optimizer"), [("vanilla", "adamw"), ("vanilla", "muon"), ("perceiver", "muon"), ("rope", "muon")]
)
def test_resumed_training_ends_bit_identical_to_an_uninterrupted_run(variant, optimizer, tmp_path):
    straight = tiny_trainer(16, None, optimizer, variant)
    straight.train()
    first = tiny_trainer(9, tmp_path / "a.ckpt", optimizer, variant)  # stops mid-epoch (6 batches an epoch)
    first.train()
    second = tiny_trainer(16, None, optimizer, variant)
    torch.manual_seed(123)  # a different RNG state, which resume must restore
    second.resume(torch_load_safe(tmp_path / "a.ckpt"))
    second.train()
    # Bitwise by design: the checkpoint restores every value and random state, and the same kernels replay the rest.
    assert second.state.losses == straight.state.losses
    for (name, a), b in zip(straight.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(a, b), name


def pretrain_cmd(tmp_path: Path, corpus: Path, *extra: str) -> list[str]:
    return RUN + [
        "pretrain", "vanilla", str(corpus), "--writing_params_path", str(tmp_path / "pt.params"), *TINY_MODEL,
        "--batch_size", "2", "--device", "cpu", *extra,
    ]  # fmt: skip


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


def test_run_killed_with_sigkill_resumes_to_the_same_final_params(tiny_corpus, tmp_path):
    straight_dir = tmp_path / "straight"
    straight_dir.mkdir()
    cmd = pretrain_cmd(straight_dir, tiny_corpus, "--max_steps", "400", "--ckpt_every", "5")
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path)
    cmd = pretrain_cmd(tmp_path, tiny_corpus, "--max_steps", "400", "--ckpt_every", "5")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    wait_for(tmp_path / "pt.params.ckpt", proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # really interrupted, not finished
    assert not (tmp_path / "pt.params").exists()
    subprocess.run(cmd + ["--resume"], check=True, capture_output=True, cwd=tmp_path)
    a = torch.load(straight_dir / "pt.params", weights_only=True)
    b = torch.load(tmp_path / "pt.params", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise by design: resumed, the same kernels replay the run


def test_sigterm_writes_a_checkpoint_and_says_how_to_resume(tiny_corpus, tmp_path):
    cmd = pretrain_cmd(tmp_path, tiny_corpus, "--max_steps", "100000", "--ckpt_every", "3")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    wait_for(tmp_path / "pt.params.ckpt", proc)
    before = (tmp_path / "pt.params.ckpt").stat().st_mtime_ns
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "--resume" in err and "Traceback" not in err
    assert (tmp_path / "pt.params.ckpt").stat().st_mtime_ns >= before
    ckpt = torch_load_safe(tmp_path / "pt.params.ckpt")
    assert ckpt["state"]["step"] >= 3


def test_resume_without_a_checkpoint_is_a_user_error(tiny_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["pretrain", "vanilla", str(tiny_corpus), "--writing_params_path", "pt.params", "--resume", *TINY_MODEL]
    assert run.main(argv) == 2
    assert "--resume: the checkpoint pt.params.ckpt: not found" in capsys.readouterr().err


def test_resume_with_other_settings_is_refused(tiny_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["pretrain", "vanilla", str(tiny_corpus), "--writing_params_path", "pt.params", *TINY_MODEL]
    assert run.main(base + ["--max_steps", "2"]) == 0
    capsys.readouterr()
    assert run.main(base + ["--max_steps", "4", "--pretrain_lr", "1e-3", "--resume"]) == 2
    assert "--pretrain_lr" in capsys.readouterr().err


def test_fresh_run_warns_before_replacing_an_existing_checkpoint(tiny_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["pretrain", "vanilla", str(tiny_corpus), "--writing_params_path", "pt.params", *TINY_MODEL]
    run.main(base + ["--max_steps", "2"])
    capsys.readouterr()
    run.main(base + ["--max_steps", "2"])
    assert "warning: pt.params.ckpt exists" in capsys.readouterr().out


def test_same_seed_gives_identical_params(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        argv = ["pretrain", "vanilla", str(tiny_corpus), "--writing_params_path", f"{name}.params", "--seed", "7"]
        assert run.main(argv + ["--max_steps", "3", *TINY_MODEL]) == 0
    a, b = (torch.load(f"{n}.params", weights_only=True) for n in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise by design: the same operations on the same numbers


def test_crash_during_a_write_leaves_the_old_file_intact(tmp_path):
    target = tmp_path / "model.params"
    target.write_bytes(b"good")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"good"
    assert list(tmp_path.iterdir()) == [target]


def test_process_killed_during_a_save_leaves_the_old_file_intact(tmp_path):
    target = tmp_path / "model.params"
    torch.save({"w": torch.ones(3)}, target)
    script = f"""
import os, signal, sys, torch
sys.path.insert(0, {str(REPO_ROOT / "src")!r})
import utils
def dying_save(obj, f):
    open(f, "wb").write(b"partial")
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = dying_save
utils.torch_save_atomic({{"w": torch.zeros(3)}}, {str(target)!r})
"""
    proc = subprocess.run([sys.executable, "-c", script])
    assert proc.returncode == -signal.SIGKILL
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))  # bitwise by design: the old file


def test_resume_on_a_changed_corpus_is_refused(tiny_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["pretrain", "vanilla", str(tiny_corpus), "--writing_params_path", "pt.params", *TINY_MODEL,
            "--batch_size", "2", "--device", "cpu", "--max_steps", "2"]  # fmt: skip
    assert run.main(argv) == 0 and Path("pt.params.ckpt").is_file()
    tiny_corpus.write_text(tiny_corpus.read_text() + "Ada Lovelace was born again in Paris.\n")
    capsys.readouterr()
    assert run.main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"was made on another {tiny_corpus}: its contents have changed since" in err
