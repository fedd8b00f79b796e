"""Specification of file writes: atomic, regular files only, through symlinks, with the umask's mode,
and never onto a command's own input."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from utils import UserError, atomic_path, refuse_same_file, torch_save_atomic, write_text_atomic


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_write_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real.predictions"
    target.write_text("old\n")
    link = tmp_path / "link.predictions"
    link.symlink_to(target)
    write_text_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"


def test_a_write_through_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.params"
    link.symlink_to(tmp_path / "made.params")
    torch_save_atomic({"w": torch.ones(2)}, link)
    assert link.is_symlink() and torch.equal(torch.load(link, weights_only=True)["w"], torch.ones(2))


def test_a_device_is_refused_not_replaced():
    with pytest.raises(UserError, match="/dev/null: is a device, not a regular file"):
        write_text_atomic("/dev/null", "x\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_to_a_device_is_refused(tmp_path):
    link = tmp_path / "out.txt"
    link.symlink_to("/dev/null")
    with pytest.raises(UserError, match="is a device"):
        write_text_atomic(link, "x\n")
    assert link.is_symlink()


@pytest.mark.parametrize(("make", "kind", "still"), [
    (os.mkfifo, "is a FIFO", lambda p: stat.S_ISFIFO(p.stat().st_mode)),
    (os.mkdir, "is a folder", lambda p: p.is_dir()),
])  # fmt: skip
def test_a_fifo_or_a_folder_is_refused_not_replaced(tmp_path, make, kind, still):
    target = tmp_path / "out"
    make(target)
    with pytest.raises(UserError, match=kind):
        write_text_atomic(target, "x\n")
    assert still(target)


def test_a_refused_write_is_one_line_and_leaves_no_temporary_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UserError) as info:
        write_text_atomic(fifo, "x\n")
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == [fifo]


def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path, umask_022):
    write_text_atomic(tmp_path / "new.txt", "x\n")
    torch_save_atomic({}, tmp_path / "new.params")
    assert mode(tmp_path / "new.txt") == mode(tmp_path / "new.params") == 0o644


def test_a_replaced_file_keeps_its_mode(tmp_path, umask_022):
    path = tmp_path / "shared.predictions"
    path.write_text("old\n")
    path.chmod(0o640)
    write_text_atomic(path, "new\n")
    assert mode(path) == 0o640 and path.read_text() == "new\n"


def test_a_folder_without_write_permission_is_a_one_line_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes in any folder")
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(UserError, match="permission denied"), atomic_path(folder / "x.txt"):
            pass
    finally:
        folder.chmod(0o755)


def test_an_output_that_is_an_input_is_refused(tmp_path):
    tsv = tmp_path / "dev.tsv"
    tsv.write_text("Q?\tA\n")
    with pytest.raises(UserError) as info:
        refuse_same_file({"--outputs_path": str(tsv)}, {"--eval_corpus_path": str(tsv)})
    assert str(info.value) == f"--outputs_path {tsv} is the same file as --eval_corpus_path; choose another name"


def test_an_output_that_is_an_input_under_another_spelling_is_refused(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    tsv = tmp_path / "d" / "dev.tsv"
    tsv.write_text("Q?\tA\n")
    monkeypatch.chdir(tmp_path / "d")
    with pytest.raises(UserError, match="same file as --eval_corpus_path"):
        refuse_same_file({"--outputs_path": "../d/./dev.tsv"}, {"--eval_corpus_path": "dev.tsv"})


def test_an_output_that_is_a_symlink_to_an_input_is_refused(tmp_path):
    params = tmp_path / "pt.params"
    params.write_bytes(b"params")
    link = tmp_path / "link.params"
    link.symlink_to(params)
    with pytest.raises(UserError, match="same file as --reading_params_path"):
        refuse_same_file({"--writing_params_path": str(link)}, {"--reading_params_path": str(params)})


def test_an_output_that_is_a_hard_link_to_an_input_is_refused(tmp_path):
    tsv = tmp_path / "dev.tsv"
    tsv.write_text("Q?\tA\n")
    os.link(tsv, tmp_path / "other.tsv")
    with pytest.raises(UserError, match="same file as --eval_corpus_path"):
        refuse_same_file({"--outputs_path": str(tmp_path / "other.tsv")}, {"--eval_corpus_path": str(tsv)})


def test_two_outputs_naming_one_file_are_refused_even_before_it_exists(tmp_path):
    out = tmp_path / "x.predictions"
    with pytest.raises(UserError, match="--scores_path .* is the same file as --outputs_path"):
        refuse_same_file({"--outputs_path": str(out), "--scores_path": str(out)}, {})


def test_distinct_files_and_unset_flags_pass(tmp_path):
    refuse_same_file(
        {"--outputs_path": str(tmp_path / "a.p"), "--scores_path": None},
        {"--eval_corpus_path": str(tmp_path / "dev.tsv"), "--reading_params_path": None},
    )


# ---------------------------------------------------------------------------
# A params file and its sidecar are saved as a pair that a kill cannot split

SAVE_KILLED = """
import os, signal, sys, torch
sys.path.insert(0, {src!r})
import params
from dataset import Vocabulary
from model import GPT, GPTConfig
real_replace = os.replace

def replace(src, dst):  # the writer is killed just before it renames its own temporary onto `kill_before`
    if str(dst).endswith({kill_before!r}) and f".{{os.getpid()}}-" in str(src):
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)

os.replace = replace
torch.manual_seed({seed})
params.save_params(GPT(GPTConfig(**{config!r})), Vocabulary(list("abc")), {path!r}, {{}})
"""
CONFIG = {"vocab_size": 5, "block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8}


def tiny_gpt(seed: int):
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(**CONFIG))


def save_in_a_process(path: Path, seed: int, kill_before: str = "nothing") -> int:
    """save_params of tiny_gpt(seed) to `path` in another process, SIGKILLed just before it renames its
    temporary onto the file whose name ends with `kill_before`; returns its exit code."""
    script = SAVE_KILLED.format(src=str(Path(__file__).resolve().parents[1] / "src"), kill_before=kill_before,
                                seed=seed, config=CONFIG, path=str(path))  # fmt: skip
    return subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120).returncode


def loaded(path: Path, capsys) -> tuple[int, str]:
    """The seed of the tiny_gpt that load_params reads from `path`, and what it said on stderr."""
    from dataset import Vocabulary
    from params import load_params

    model = tiny_gpt(99)
    load_params(model, Vocabulary(list("abc")), str(path))
    # Bitwise by design: the same seed draws the same initial weights, which save and load keep.
    seeds = [s for s in range(3) if torch.equal(model.tok_emb.weight, tiny_gpt(s).tok_emb.weight)]
    return seeds[0], capsys.readouterr().err


@pytest.fixture
def saved_pair(tmp_path):
    from dataset import Vocabulary
    from params import save_params

    path = tmp_path / "x.params"
    save_params(tiny_gpt(0), Vocabulary(list("abc")), str(path), {})
    return path


def test_a_save_killed_before_its_sidecar_is_renamed_keeps_the_old_pair(saved_pair, capsys):
    assert save_in_a_process(saved_pair, seed=1, kill_before=".params.json") == -signal.SIGKILL
    assert loaded(saved_pair, capsys) == (0, "")


def test_a_save_killed_between_its_two_renames_is_finished_when_the_params_are_read(saved_pair, capsys):
    assert save_in_a_process(saved_pair, seed=1, kill_before=".params") == -signal.SIGKILL
    seed, err = loaded(saved_pair, capsys)
    assert seed == 1 and err.startswith(f"note: {saved_pair}: finished the save a kill interrupted")
    assert err.count("\n") == 1 and sorted(p.name for p in saved_pair.parent.iterdir()) == ["x.params", "x.params.json"]


def test_a_first_save_killed_between_its_two_renames_is_finished_too(tmp_path, capsys):
    path = tmp_path / "x.params"
    assert save_in_a_process(path, seed=1, kill_before=".params") == -signal.SIGKILL
    assert not path.exists() and loaded(path, capsys)[0] == 1


def test_a_save_after_a_killed_one_keeps_the_killed_ones_pair_until_its_own_is_in_place(saved_pair, capsys):
    assert save_in_a_process(saved_pair, seed=1, kill_before=".params") == -signal.SIGKILL
    assert save_in_a_process(saved_pair, seed=2, kill_before=".params.json") == -signal.SIGKILL
    assert loaded(saved_pair, capsys)[0] == 1


def test_a_save_that_is_not_killed_replaces_the_pair(saved_pair, capsys):
    assert save_in_a_process(saved_pair, seed=1) == 0
    assert loaded(saved_pair, capsys) == (1, "")
