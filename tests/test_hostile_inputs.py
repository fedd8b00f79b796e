"""Specification of run.py against hostile input: each mistake is one line on stderr, exit code 2, and
nothing written or left behind (no params, no sidecar, no TensorBoard folder); no kill or full disk
loses a file that was there."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_MODEL

import answers
import logs
import run
import utils
from utils import UserError, atomic_path, torch_save_atomic, write_text_atomic


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def refused(capsys, argv: list, *fragments: str) -> str:
    """Run run.py's main on argv and check the refusal: exit 2, one line holding every fragment."""
    assert run.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def nothing_written(*names: str) -> bool:
    return not any(Path(n).exists() for n in names) and not Path("expt").exists()


def pretrain(corpus, *extra) -> list:
    return ["pretrain", "vanilla", corpus, "--writing_params_path", "pt.params", *TINY_MODEL, "--max_steps", 2, *extra]


def finetuned(corpus, tsv, name: str = "ft.params", *extra) -> str:
    argv = ["finetune", "vanilla", corpus, "--writing_params_path", name, "--finetune_corpus_path", tsv]
    assert run.main([str(a) for a in [*argv, *TINY_MODEL, "--max_steps", 2, *extra]]) == 0
    return name


def evaluate(corpus, params, tsv, *extra) -> list:
    return ["evaluate", "vanilla", corpus, "--reading_params_path", params, "--eval_corpus_path", tsv,
            "--outputs_path", "out.predictions", *TINY_MODEL, *extra]  # fmt: skip


# ---------------------------------------------------------------------------
# Training that goes wrong


@pytest.mark.parametrize("argv", [["--pretrain_lr", "1e30"]])
def test_a_loss_that_becomes_nan_stops_training_and_writes_no_params(tiny_corpus, capsys, argv):
    refused(capsys, pretrain(tiny_corpus, *argv, "--max_steps", 20), "the loss became nan", "lower the learning rate")
    assert nothing_written("pt.params", "pt.params.json")  # nor the TensorBoard folders made for the run


def test_a_finetune_whose_loss_becomes_nan_writes_no_params(tiny_corpus, tiny_train_tsv, capsys):
    argv = ["finetune", "vanilla", tiny_corpus, "--writing_params_path", "ft.params", "--finetune_lr", "1e30",
            "--finetune_corpus_path", tiny_train_tsv, *TINY_MODEL, "--max_steps", 20]  # fmt: skip
    refused(capsys, argv, "the loss became nan")
    assert not Path("ft.params").exists()


@pytest.mark.parametrize(
    "argv, message",
    [(["--n_embd", "10000000", "--n_head", "8"], "GiB to train; this machine has"),
     (["--n_layer", "1000000"], "GiB to train; this machine has")],
)  # fmt: skip
def test_a_model_too_large_for_the_memory_is_refused_before_it_is_built(tiny_corpus, capsys, argv, message):
    refused(capsys, ["pretrain", "vanilla", tiny_corpus, "--writing_params_path", "pt.params", *argv], message)
    assert nothing_written("pt.params")


def test_a_bottleneck_length_out_of_range_is_refused_for_every_variant(tiny_corpus, capsys):
    refused(capsys, pretrain(tiny_corpus, "--bottleneck_dim", "-5"), "--bottleneck_dim must be between 1 and 128")


def test_a_long_tensorboard_name_is_refused_before_any_folder_is_made(tiny_corpus, capsys):
    refused(
        capsys,
        pretrain(tiny_corpus, "--tb_expt_name", "x" * 300),
        "--tb_expt_name must be a plain name of at most 100 characters",
    )
    assert nothing_written("pt.params")


# ---------------------------------------------------------------------------
# Names and paths


def test_an_output_name_too_long_for_its_checkpoint_beside_it_is_refused_before_training(tiny_corpus, capsys):
    name = "p" * 252
    refused(capsys, ["pretrain", "vanilla", tiny_corpus, "--writing_params_path", name, *TINY_MODEL],
            "--writing_params_path", "the name is 252 bytes; at most 250 fit")  # fmt: skip
    assert nothing_written(name)


def test_a_legal_long_output_name_trains_and_writes_its_files(tiny_corpus):
    name = "p" * 243  # its temporaries and .ckpt must stay within the 255-byte name limit
    assert run.main([str(a) for a in pretrain(tiny_corpus)[:3]] + ["--writing_params_path", name, *TINY_MODEL,
                    "--max_steps", "2"]) == 0  # fmt: skip
    assert Path(name).is_file() and Path(f"{name}.json").is_file()


def test_an_output_through_a_missing_folder_and_back_is_refused_before_training(tiny_corpus, capsys):
    # "missing/.." resolves to this folder, but the system cannot open a path through a folder that is not there
    refused(capsys, [*pretrain(tiny_corpus)[:3], "--writing_params_path", "missing/../pt.params", *TINY_MODEL],
            "--writing_params_path missing/../pt.params: folder missing/.. does not exist")  # fmt: skip
    assert nothing_written("pt.params")


@pytest.mark.parametrize("flag", ["--reading_params_path", "--scores_path", "--tb_dir"])
def test_an_empty_path_is_refused_before_any_work(tiny_corpus, tiny_dev_tsv, capsys, flag):
    # any readable file stands for the params: the empty path is refused before they are read
    argv = (
        pretrain(tiny_corpus) if flag == "--reading_params_path" else evaluate(tiny_corpus, tiny_dev_tsv, tiny_dev_tsv)
    )
    refused(capsys, [*argv, flag, ""], f"{flag} is empty; give a path")
    assert nothing_written("pt.params", "out.predictions")


@pytest.mark.parametrize("role", ["corpus", "eval corpus", "output"])
def test_a_symlink_loop_is_a_one_line_error(tiny_corpus, tiny_dev_tsv, tiny_train_tsv, capsys, role):
    Path("loop").symlink_to("loop")
    params = finetuned(tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    argv = {
        "corpus": pretrain("loop"),
        "eval corpus": evaluate(tiny_corpus, params, "loop"),
        "output": ["evaluate", "vanilla", tiny_corpus, "--reading_params_path", params, "--eval_corpus_path",
                   tiny_dev_tsv, "--outputs_path", "loop", *TINY_MODEL],
    }[role]  # fmt: skip
    refused(capsys, argv, "loop")


# ---------------------------------------------------------------------------
# Data


def test_a_corpus_starting_with_a_byte_order_mark_is_refused(tiny_corpus, capsys):
    tiny_corpus.write_text("\ufeff" + tiny_corpus.read_text(encoding="utf-8"), encoding="utf-8")
    refused(capsys, pretrain(tiny_corpus), "byte-order mark")
    assert nothing_written("pt.params")


def test_a_corpus_of_blank_lines_is_refused(tmp_path, capsys):
    corpus = tmp_path / "blank.txt"
    corpus.write_text("\n  \n\t\n   \n", encoding="utf-8")
    refused(capsys, pretrain(corpus), "contains no documents")


def test_a_place_with_spaces_around_it_is_refused_naming_its_line(tiny_corpus, tiny_train_tsv, tmp_path, capsys):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    dev = tmp_path / "spaced.tsv"
    dev.write_text("Where was Ada Lovelace born?\tLondon\nWhere was Carl Gauss born?\tBrunswick \n", encoding="utf-8")
    capsys.readouterr()
    refused(capsys, evaluate(tiny_corpus, params, dev), "spaced.tsv:2", "'Brunswick ' has spaces around it")


def test_a_document_far_longer_than_the_block_costs_no_more_memory_than_the_block(tmp_path):
    from dataset import CharCorruptionDataset

    ds = CharCorruptionDataset("a short one\n" + "x" * 1_000_000 + "\n", 128)
    assert ds.doc_ids.shape == (2, 128)


# ---------------------------------------------------------------------------
# Sidecars are inputs too


def sidecar_with(params: str, **fields) -> None:
    side = Path(f"{params}.json")
    side.write_text(json.dumps({**json.loads(side.read_text(encoding="utf-8")), **fields}), encoding="utf-8")


@pytest.mark.parametrize(
    "fields, message",
    [({"bottleneck_dim": "x"}, "its sidecar gives bottleneck_dim 'x'"),
     ({"n_embd": 10_000_000, "n_head": 8}, "GiB to train"),
     ({"n_layer": True}, "its sidecar gives n_layer True")],
)  # fmt: skip
def test_a_sidecar_with_bad_sizes_is_refused_before_a_model_is_built(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys, fields, message
):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    sidecar_with(params, **fields)
    capsys.readouterr()
    refused(capsys, ["evaluate", "vanilla", tiny_corpus, "--reading_params_path", params, "--eval_corpus_path",
                     tiny_dev_tsv, "--outputs_path", "out.predictions"], message)  # fmt: skip
    assert not Path("out.predictions").exists()


def test_a_sidecar_that_cannot_be_read_is_a_one_line_error(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys, monkeypatch
):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    real = Path.read_text

    def denied(self: Path, *args, **kwargs) -> str:
        if self.name == f"{params}.json":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    refused(capsys, evaluate(tiny_corpus, params, tiny_dev_tsv), "sidecar cannot be read (Permission denied)")


def reader(corpus: Path, tsv: Path) -> str:
    pretrained = ["pretrain", "vanilla", corpus, "--writing_params_path", "pt.params", *TINY_MODEL, "--max_steps", 2]
    assert run.main([str(a) for a in pretrained]) == 0
    return finetuned(corpus, tsv, "reader.params", "--reading_params_path", "pt.params", "--recite",
                     "--recite_chars", "40")  # fmt: skip


@pytest.mark.parametrize("chars", [None, "abc", 100000, -5, True, 126])  # 126: no room left for a one-letter place
def test_a_readers_sidecar_with_a_bad_recitation_length_is_refused(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys, chars
):
    params = reader(tiny_corpus, tiny_train_tsv)
    sidecar_with(params, recite_chars=chars)
    capsys.readouterr()
    refused(capsys, evaluate(tiny_corpus, params, tiny_dev_tsv), f"its sidecar gives recite_chars {chars!r}")


def test_a_reader_cannot_recite_for_a_new_reader(tiny_corpus, tiny_train_tsv, capsys):
    params = reader(tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    argv = ["finetune", "vanilla", tiny_corpus, "--reading_params_path", params, "--recite", "--writing_params_path",
            "r2.params", "--finetune_corpus_path", tiny_train_tsv, *TINY_MODEL]  # fmt: skip
    refused(capsys, argv, f"--reading_params_path {params} is a recite reader")
    assert not Path("r2.params").exists()


def test_finetuning_directly_from_a_reader_says_so_and_records_where_it_started(tiny_corpus, tiny_train_tsv, capsys):
    params = reader(tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    finetuned(tiny_corpus, tiny_train_tsv, "direct.params", "--reading_params_path", params)
    assert f"note: {params} is a recite reader" in capsys.readouterr().out
    side = json.loads(Path("direct.params.json").read_text(encoding="utf-8"))
    assert side["config"]["reading_params_path"] == params and "parent_sha256" in side and "protocol" not in side


# ---------------------------------------------------------------------------
# Writes that a kill or a full disk interrupts


def test_a_full_disk_while_saving_is_one_line_naming_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "x.params"
    target.write_bytes(b"old")

    def full(obj, f):
        Path(f).write_bytes(b"part")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed\nmore")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(UserError, match=r"x.params: cannot be written \(PytorchStreamWriter failed"):
        torch_save_atomic({"w": torch.zeros(2)}, target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.params"]


def test_a_save_that_fails_on_a_full_disk_says_the_disk_is_full(tmp_path, monkeypatch):
    def full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 128 vs 0")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(utils.shutil, "disk_usage", lambda path: SimpleNamespace(total=200_000, used=200_000, free=0))
    with pytest.raises(UserError, match=r"x.params: cannot be written \(No space left on device\)"):
        torch_save_atomic({"w": torch.zeros(2)}, tmp_path / "x.params")


def test_training_without_room_for_its_checkpoints_is_refused_before_any_work(tiny_corpus, monkeypatch, capsys):
    monkeypatch.setattr(utils.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**9, used=10**9, free=1000))
    refused(capsys, pretrain(tiny_corpus), "0.0 MB free; two checkpoints (one replacing the other), params need about")
    assert nothing_written("pt.params", "pt.params.ckpt")


def test_a_tensorboard_folder_on_a_full_disk_is_one_line_and_left_behind_by_nothing(tiny_corpus, monkeypatch, capsys):
    def full_disk_writer(log_dir: str) -> None:
        Path(log_dir).mkdir(parents=True)  # as SummaryWriter does, before its first write fails
        (Path(log_dir) / "events.out.tfevents.0").write_bytes(b"")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logs, "SummaryWriter", full_disk_writer)
    argv = ["pretrain", "vanilla", tiny_corpus, "--writing_params_path", "pt.params", "--max_steps", "1", *TINY_MODEL]
    refused(capsys, argv, "expt/pretrain/run_vanilla_pretrain_seed0_", "cannot be written (No space left on device)")
    assert not Path("expt").exists() and not Path("pt.params").exists()


def test_a_full_disk_while_writing_text_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "out.predictions"
    target.write_text("old\n")
    monkeypatch.setattr(
        Path, "write_text", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
    )
    with pytest.raises(UserError, match="out.predictions: cannot be written \\(No space left on device\\)"):
        write_text_atomic(target, "new\n")
    assert target.read_text() == "old\n" and len(list(tmp_path.iterdir())) == 1


def test_a_write_removes_the_temporaries_a_killed_write_left_and_spares_a_running_ones(tmp_path):
    target = tmp_path / "x.params"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".x.params.{int(dead.stdout)}-0123abcd.tmp"
    live = tmp_path / f".x.params.{os.getpid()}-4567cdef.tmp"
    stale.write_bytes(b"half")
    live.write_bytes(b"in progress")
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert not stale.exists() and live.exists() and target.read_bytes() == b"new"


def test_a_temporary_name_stays_within_the_name_limit_for_the_longest_legal_name(tmp_path):
    target = tmp_path / ("n" * 250)
    with atomic_path(target) as tmp:
        assert len(tmp.name.encode()) <= 255
        tmp.write_bytes(b"x")
    assert target.read_bytes() == b"x"


@pytest.mark.parametrize("weight", [float("nan"), 1e38])  # 1e38 is finite, but the logits overflow
def test_params_giving_non_finite_logits_with_a_consistent_hash_are_refused_in_one_line(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys, weight
):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    corpus = run.CharCorruptionDataset(run.read_text(tiny_corpus), run.BLOCK_SIZE)
    config = run.resolved_config([str(a) for a in evaluate(tiny_corpus, params, tiny_dev_tsv)])
    model = run.build_model(config, corpus.vocab_size)
    with torch.no_grad():
        model.head.weight.fill_(weight)
    run.save_params(model, corpus.vocab, params, {})  # sealed anew: its hash matches
    shutil.rmtree("expt")
    capsys.readouterr()
    refused(capsys, evaluate(tiny_corpus, params, tiny_dev_tsv), "its weights give NaN or infinite logits")
    assert nothing_written("out.predictions", "out.predictions.json")


def test_new_params_beside_an_old_sidecar_are_refused_as_a_pair_a_kill_split(tiny_corpus, tiny_train_tsv, capsys):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    old_sidecar = Path(f"{params}.json").read_bytes()
    finetuned(tiny_corpus, tiny_train_tsv, params, "--seed", 1)  # the same sizes, other weights
    Path(f"{params}.json").write_bytes(old_sidecar)  # as if killed between the two renames
    capsys.readouterr()
    refused(
        capsys,
        evaluate(tiny_corpus, params, tiny_train_tsv),
        f"{params}: damaged or replaced: its bytes do not match the SHA-256 its sidecar {params}.json records",
    )


@pytest.fixture
def signal_handlers():
    """This process's handlers of run.py's stop signals as they were before the test (run.main sets them)."""
    handlers = {sig: signal.getsignal(sig) for sig in run.STOP_SIGNALS}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_signal_while_evaluating_writes_nothing_and_says_so(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys, monkeypatch, signal_handlers, sig
):
    params = finetuned(tiny_corpus, tiny_train_tsv)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), sig)  # Ctrl-C, a kill or a closed terminal while the answers are decoded
        time.sleep(5)  # the handler interrupts the wait

    monkeypatch.setattr(answers, "predict", interrupted)
    shutil.rmtree("expt")
    capsys.readouterr()
    assert run.main([str(a) for a in evaluate(tiny_corpus, params, tiny_dev_tsv)]) == 130
    assert capsys.readouterr().err == "interrupted before the command finished; nothing to resume\n"
    assert nothing_written("out.predictions", "out.predictions.json")


def test_ctrl_c_while_run_py_starts_exits_130_without_a_traceback(tiny_corpus):
    cmd = [sys.executable, str(Path(run.__file__)), *[str(a) for a in pretrain(tiny_corpus)]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.monotonic() + 60
    while "libtorch" not in maps.read_text():  # past run.py's first lines, inside `import torch`: not a fixed sleep
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err


# ---------------------------------------------------------------------------
# Nothing of the user's is removed, nothing damaged is used without a word


@pytest.mark.parametrize("tb_dir", ["mytb", "a/b"])
@pytest.mark.parametrize("how", ["a loss that becomes nan", "a full disk under the TensorBoard folder"])
def test_a_failed_run_removes_only_the_folders_it_made(tiny_corpus, capsys, monkeypatch, tb_dir, how):
    Path(tb_dir.split("/")[0]).mkdir()  # the user's own (empty) folder
    extra = ["--pretrain_lr", "1e30", "--max_steps", 20] if how.startswith("a loss") else []
    if how.startswith("a full disk"):

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(logs.SummaryWriter, "add_scalar", full)
    refused(capsys, pretrain(tiny_corpus, "--tb_dir", tb_dir, *extra))
    assert Path(tb_dir.split("/")[0]).is_dir()  # still there
    assert not Path("a/b").exists()  # the folder the run made is gone


def test_a_tensorboard_folder_and_params_of_the_same_name_are_refused_before_training(tiny_corpus, capsys):
    refused(capsys, ["pretrain", "vanilla", tiny_corpus, "--writing_params_path", "same", "--tb_dir", "same"],
            "is the same file as --tb_dir")  # fmt: skip
    assert nothing_written("same", "same.ckpt")


@pytest.mark.parametrize("question", ["Where was Ada\u2047 born?", "Where was Ada\u25a1 born?", "Where was\nAda born?"])
def test_a_question_with_a_reserved_character_or_a_line_break_is_refused(tiny_corpus, tiny_train_tsv, capsys, question):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    capsys.readouterr()
    err = refused(capsys, ["ask", "vanilla", tiny_corpus, question, "--reading_params_path", params, *TINY_MODEL])
    assert "reserved character" in err or "line break" in err


@pytest.mark.parametrize("line", ["Where was Ada born?\tLon\u25a1don", "Where was Ada\u2047 born?\tLondon"])
@pytest.mark.parametrize("command", ["finetune", "evaluate"])
def test_a_question_file_with_a_reserved_character_is_refused_naming_its_line(
    tiny_corpus, tiny_train_tsv, capsys, line, command
):
    Path("bad.tsv").write_text(f"Where was Carl Gauss born?\tBrunswick\n{line}\n", encoding="utf-8")
    if command == "finetune":
        argv = ["finetune", "vanilla", tiny_corpus, "--writing_params_path", "x.params", "--finetune_corpus_path",
                "bad.tsv", *TINY_MODEL]  # fmt: skip
    else:
        argv = evaluate(tiny_corpus, finetuned(tiny_corpus, tiny_train_tsv), "bad.tsv")
        capsys.readouterr()
    refused(capsys, argv, "bad.tsv:2: holds the reserved character")


def flip_a_byte(path: str | Path, at: float = 0.6) -> None:
    data = bytearray(Path(path).read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def test_resume_from_a_checkpoint_with_one_flipped_byte_is_refused_naming_it(tiny_corpus, capsys):
    assert run.main([str(a) for a in pretrain(tiny_corpus, "--ckpt_every", 1)]) == 0  # keeps pt.params.ckpt
    flip_a_byte("pt.params.ckpt")
    capsys.readouterr()
    refused(capsys, pretrain(tiny_corpus, "--resume", "--max_steps", 4), "pt.params.ckpt", "damaged")


def twice_the_shape(ckpt: dict) -> None:
    name = next(iter(ckpt["model"]))
    ckpt["model"][name] = torch.cat([ckpt["model"][name]] * 2)


# Checkpoints whose seal is valid but whose contents this run cannot continue: each edit, then sealed again.
SEALED_BUT_WRONG = {
    "not a dict": lambda ckpt: ckpt.clear(),
    "no model": lambda ckpt: ckpt.pop("model"),
    "no state": lambda ckpt: ckpt.pop("state"),
    "an empty state": lambda ckpt: ckpt.update(state={}),
    "a step that is text": lambda ckpt: ckpt["state"].update(step="abc"),
    "a negative step": lambda ckpt: ckpt["state"].update(step=-5),
    "an epoch past the run": lambda ckpt: ckpt["state"].update(epoch=10**6),
    "a step past its epoch": lambda ckpt: ckpt["state"].update(step=ckpt["state"]["step"] + 1),
    "an unknown state field": lambda ckpt: ckpt["state"].update(colour="red"),
    "tensors of twice the shape": twice_the_shape,
    "no generator states": lambda ckpt: ckpt.pop("rng"),
    "a 3-byte generator state": lambda ckpt: ckpt["rng"].update(torch=torch.zeros(3, dtype=torch.uint8)),
    "an empty optimizer state": lambda ckpt: ckpt.update(optimizer={}),
    "extra that is not a dict": lambda ckpt: ckpt.update(extra=5),
}


@pytest.mark.parametrize("edit", SEALED_BUT_WRONG.values(), ids=SEALED_BUT_WRONG.keys())
def test_a_sealed_checkpoint_whose_contents_do_not_fit_the_run_is_refused_in_one_line(tiny_corpus, capsys, edit):
    assert run.main([str(a) for a in pretrain(tiny_corpus)]) == 0  # --max_steps: keeps pt.params.ckpt
    params = Path("pt.params").read_bytes()
    ckpt = utils.torch_load_safe("pt.params.ckpt")
    edit(ckpt)
    torch_save_atomic(ckpt, "pt.params.ckpt", sealed=True)
    capsys.readouterr()
    refused(capsys, pretrain(tiny_corpus, "--resume", "--max_steps", 4), "pt.params.ckpt")
    assert Path("pt.params").read_bytes() == params


def test_resume_is_refused_when_the_params_the_finetune_started_from_have_been_replaced(
    tiny_corpus, tiny_train_tsv, capsys
):
    assert run.main([str(a) for a in pretrain(tiny_corpus)]) == 0
    finetune = ["finetune", "vanilla", tiny_corpus, "--reading_params_path", "pt.params", "--writing_params_path",
                "ft.params", "--finetune_corpus_path", tiny_train_tsv, *TINY_MODEL]  # fmt: skip
    assert run.main([str(a) for a in [*finetune, "--max_steps", 2]]) == 0  # keeps ft.params.ckpt
    assert run.main([str(a) for a in pretrain(tiny_corpus, "--seed", 7)]) == 0  # another pretraining in its place
    capsys.readouterr()
    refused(capsys, [*finetune, "--max_steps", 4, "--resume"], "was made from other params than pt.params holds now")


def test_params_with_a_flipped_byte_are_refused_and_params_without_a_hash_are_used_with_a_warning(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys
):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    flip_a_byte(params)
    refused(capsys, evaluate(tiny_corpus, params, tiny_dev_tsv), f"{params}: damaged or replaced")
    params = finetuned(tiny_corpus, tiny_train_tsv, "plain.params")
    Path(f"{params}.json").unlink()
    capsys.readouterr()
    assert run.main([str(a) for a in evaluate(tiny_corpus, params, tiny_dev_tsv)]) == 0
    assert "plain.params: no SHA-256 in a sidecar beside it, so its bytes cannot be verified" in capsys.readouterr().err


def test_a_dropout_too_close_to_one_to_train_is_refused(tiny_corpus, capsys):
    refused(capsys, pretrain(tiny_corpus, "--dropout", "0.99999"), "--dropout must be between 0 and 0.99")


def test_params_whose_sidecar_records_no_vocabulary_are_used_with_a_warning_to_use_their_corpus(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys
):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    side = json.loads(Path(f"{params}.json").read_text())
    del side["vocab"]  # as an older sidecar: the model's sizes and the params' hash only
    Path(f"{params}.json").write_text(json.dumps(side))
    capsys.readouterr()
    assert run.main([str(a) for a in evaluate(tiny_corpus, params, tiny_dev_tsv)]) == 0
    assert (
        f"warning: {params}: its sidecar records no vocabulary; use the corpus it was trained on"
        in capsys.readouterr().err
    )


def test_a_scores_file_that_cannot_be_written_leaves_no_predictions_behind(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys, monkeypatch
):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    write = answers.write_text_atomic

    def full_disk_for_scores(path, text):
        if str(path) == "out.scores":
            raise UserError(f"{path}: cannot be written (No space left on device)")
        write(path, text)

    monkeypatch.setattr(answers, "write_text_atomic", full_disk_for_scores)
    capsys.readouterr()
    refused(capsys, evaluate(tiny_corpus, params, tiny_dev_tsv, "--scores_path", "out.scores"), "out.scores")
    assert not Path("out.predictions").exists() and not Path("out.predictions.json").exists()


@pytest.mark.parametrize("place", ["Lon\x00don", "Lond\u00f8n"])
def test_a_gold_place_with_a_character_outside_the_vocabulary_is_refused_naming_its_line(
    tiny_corpus, tiny_train_tsv, capsys, place
):
    params = finetuned(tiny_corpus, tiny_train_tsv)
    Path("gold.tsv").write_text(f"Where was Ada Lovelace born?\tLondon\nWhere was Carl Gauss born?\t{place}\n")
    capsys.readouterr()
    refused(capsys, evaluate(tiny_corpus, params, "gold.tsv"), "gold.tsv:2: character", "is not in the vocabulary")
    assert not Path("out.predictions").exists()
