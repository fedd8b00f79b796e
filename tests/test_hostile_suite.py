"""Specification of every entry point against hostile flag values: each flag of run.py's four commands,
london_baseline.py, addsub.py's commands, the demo's play_char.py and run.sh's settings is classified in
KINDS, and each numeric flag (nan, inf, -1, 0, 10**12) and each path flag (a folder, a missing file, a
FIFO, /dev/null, a path through a regular file) is refused in one line on stderr, exit code 2, before
any model is built, with nothing written; a value that is legitimate is listed in ALLOWED with the reason.
A flag that is not in KINDS fails the suite until it is classified there."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PEOPLE, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "mingpt-demo"))
import play_char  # noqa: E402

import addsub  # noqa: E402
import config  # noqa: E402
import london_baseline  # noqa: E402
import run  # noqa: E402

# ---------------------------------------------------------------------------
# What each flag is. int and float: numbers; input and output: files read or written; input_dir and
# output_dir: folders. Not tried here: choice (argparse refuses any other word), switch (takes no value)
# and text (any string is a value; the tests of each entry point cover its own texts).


def run_py_kinds() -> dict[str, str]:
    """Each run.py flag's kind, read from its RunConfig field: the kind the field names (a data file is an
    input), else a switch, a choice or what its parser's type says (int, float; text otherwise)."""
    kinds = {}
    for f in dataclasses.fields(config.RunConfig):
        m, named = f.metadata, {"data": "input"}.get(f.metadata["kind"], f.metadata["kind"])
        parsed = {int: "int", float: "float"}.get(m.get("type"), "text")
        kinds[f.name] = named or ("switch" if m.get("action") else "choice" if m.get("choices") else parsed)
    return kinds


RUN_PY = run_py_kinds()
ADDSUB_TRAIN = {
    "outputs_path": "output", "data_dir": "input_dir", "logdir": "output_dir", "device": "choice",
    "no_progress": "switch", "vocab_size": "int", "max_len": "int", "emb_dim": "int", "num_heads": "int",
    "num_encoder_layers": "int", "num_decoder_layers": "int", "dim_feedforward": "int", "dropout": "float",
    "epochs": "int", "batch_size": "int", "lr": "float", "weight_decay": "float", "lr_schedule": "choice",
    "warmup_steps": "int", "grad_clip": "float", "label_smoothing": "float", "seed": "int", "pos_encoding": "choice",
}  # fmt: skip
PLAY_CHAR = {
    "input": "input", "writing_params_path": "output", "reading_params_path": "input", "block_size": "int",
    "n_layer": "int", "n_head": "int", "n_embd": "int", "dropout": "float", "max_iters": "int",
    "batch_size": "int", "learning_rate": "float", "warmup_iters": "int", "val_fraction": "float",
    "print_every": "int", "seed": "int", "device": "choice", "threads": "int", "fp32": "switch", "prompt": "text",
    "sample_chars": "int", "temperature": "float", "top_k": "int", "greedy": "switch",
}  # fmt: skip
RUN_SH = {
    "VARIANTS": "text", "TOTAL_MINUTES": "float", "SEED": "int", "OUT_DIR": "output_dir", "EXTRA_FLAGS": "text",
    "RECORD": "choice", "PRESET": "choice", "PRETRAIN_EPOCHS": "int", "FINETUNE_EPOCHS": "int",
    "NOPRETRAIN_EPOCHS": "int", "PLAN_ONLY": "choice", "QUESTION_EPOCH_SECONDS": "float", "DEV_SECONDS": "float",
}  # fmt: skip
KINDS = {
    **{f"run.py {c}": RUN_PY for c in config.FUNCTIONS},  # each command takes some of them
    "london_baseline.py": {"eval_corpus_path": "input", "outputs_path": "output"},
    "addsub.py data": {"data_dir": "output_dir", "seed": "int"},
    "addsub.py train": ADDSUB_TRAIN,
    "addsub.py evaluate": {"reading_params_path": "input", "split": "choice", "data_dir": "input_dir",
                           "device": "choice"},
    "addsub.py ask": {"expression": "text", "reading_params_path": "input"},
    "play_char.py": PLAY_CHAR,
    "run.sh": RUN_SH,
}  # fmt: skip

NUMBERS = ["nan", "inf", "-1", "0", str(10**12)]
TOO_LONG = {"a name too long": "n" * 300, "a path too long": "/".join(["d" * 250] * 17)}  # over 255 and 4096 bytes
PATHS = {  # kind -> {hostile value's name: the path given}
    "input": {"a folder": "folder", "a missing file": "missing.txt", "a FIFO": "fifo", "/dev/null": "/dev/null",
              "a path through a regular file": "regular.txt/x"},
    "output": {"a folder": "folder", "a file in a missing folder": "nowhere/x.out", "a FIFO": "fifo",
               "/dev/null": "/dev/null", "a path through a regular file": "regular.txt/x"},
    "input_dir": {"a regular file": "regular.txt", "a missing folder": "nowhere", "a FIFO": "fifo",
                  "/dev/null": "/dev/null", "a path through a regular file": "regular.txt/x"},
    "output_dir": {"a regular file": "regular.txt", "a FIFO": "fifo", "/dev/null": "/dev/null",
                   "a path through a regular file": "regular.txt/x"},
}  # fmt: skip
PATHS = {kind: {**values, **TOO_LONG, "an empty path": ""} for kind, values in PATHS.items()}

# Values that are legitimate, with the reason. Keys: (entry point, flag, value or hostile path's name).
ALLOWED = {
    **{(f"run.py {c}", "seed", "0"): "seeds are 0..2**32-1" for c in config.FUNCTIONS},
    **{(f"run.py {c}", f, str(10**12)): "a cap on the run's length; --budget_minutes, --max_steps or Ctrl-C "
       "(a checkpoint) end a long run" for c in ("pretrain", "finetune") for f in ("max_epochs", "max_steps")},
    **{(f"run.py {c}", "batch_size", str(10**12)): "a batch holds at most the whole epoch"
       for c in ("pretrain", "finetune")},
    **{(f"run.py {c}", f"{p}_lr", str(10**12)): "a rate is the user's choice; a loss that diverges stops "
       "training in one line before any params are written" for c, p in (("pretrain", "pretrain"),
                                                                         ("finetune", "finetune"))},
    **{(f"run.py {c}", "ckpt_every", v): "0: a checkpoint at the end only; more steps than the run: the same"
       for c in ("pretrain", "finetune") for v in ("0", str(10**12))},
    **{(f"run.py {c}", "dropout", "0"): "no dropout (the cpu preset's)" for c in ("pretrain", "finetune")},
    **{(f"run.py {c}", "micro_batch", v): "0: whole batches; more rows than a batch: the same"
       for c in ("pretrain", "finetune") for v in ("0", str(10**12))},
    ("run.py pretrain", "mix_share", "0"): "no questions mixed in (the default)",
    **{(f"run.py {c}", "budget_minutes", str(10**12)): "a budget is a cap, and the cpu preset plans to it"
       for c in ("pretrain", "finetune")},
    ("addsub.py data", "seed", "0"): "any seed 0..2**32-1 makes a split",
    ("addsub.py train", "seed", "0"): "seeds are 0..2**32-1",
    **{("addsub.py train", f, "0"): "0 turns it off" for f in ("weight_decay", "grad_clip", "warmup_steps",
                                                               "dropout", "label_smoothing")},
    **{("addsub.py train", f, str(10**12)): "a long run, a wide clip or a long warm-up is the user's choice"
       for f in ("epochs", "batch_size", "grad_clip", "warmup_steps", "weight_decay", "lr")},
    **{("play_char.py", f, "0"): "0 turns it off (top_k 0: all characters; threads 0: torch's default)"
       for f in ("dropout", "warmup_iters", "top_k", "threads", "seed", "val_fraction", "sample_chars")},
    **{("play_char.py", f, str(10**12)): "a long run, a long warm-up, rare printing or a wide top_k is the "
       "user's choice" for f in ("max_iters", "warmup_iters", "print_every", "top_k", "learning_rate")},
    ("play_char.py", "batch_size", str(10**12)): "a batch holds at most every window of the text",
    ("play_char.py", "temperature", str(10**12)): "a high temperature samples uniformly",
    ("run.sh", "SEED", "0"): "seeds are 0..2**32-1",
    ("run.sh", "OUT_DIR", "an empty path"): "an empty setting is an unset one, as in the shell: outputs/",
    ("run.sh", "TOTAL_MINUTES", str(10**12)): "a long plan is the user's choice",
    **{("run.sh", f, str(10**12)): "epochs are the user's choice" for f in ("PRETRAIN_EPOCHS", "FINETUNE_EPOCHS",
                                                                         "NOPRETRAIN_EPOCHS")},
}  # fmt: skip


# Hostile values that get through today, each an open gap in a file this suite cannot change: the case is an
# expected failure until the guard is added, and then fails as an unexpected pass until its line goes.
GAPS: dict[tuple[str, str, str], str] = {}

# ---------------------------------------------------------------------------
# The entry points' flags, read from their parsers


class Captured(Exception):
    """Carries the parser an entry point built, caught as it starts parsing."""


def captured_parser(parse, parser_class: type) -> argparse.ArgumentParser:
    """The parser that `parse([])` builds inline (london_baseline.main, play_char.parse_args)."""
    real = parser_class.parse_args

    def capture(self, *args, **kwargs):
        raise Captured(self)

    parser_class.parse_args = capture
    try:
        parse([])
    except Captured as c:
        return c.args[0]
    finally:
        parser_class.parse_args = real
    raise AssertionError(f"{parse} parsed no arguments")


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    skip = (argparse._HelpAction, argparse._SubParsersAction)
    return {a.dest for a in parser._actions if not isinstance(a, skip)}


def addsub_parser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in addsub.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def run_sh_settings() -> set[str]:
    """The environment settings run.sh reads before its set-up, from its ${NAME:=...} and ${NAME-...}."""
    checks = (REPO_ROOT / "run.sh").read_text(encoding="utf-8").split("source ./setup.sh")[0]
    return set(re.findall(r"\$\{([A-Z_]+)(?::=|-)", checks))


def entry_flags() -> dict[str, set[str]]:
    flags = {f"run.py {c}": flags_of(run.make_parser(c)) for c in config.FUNCTIONS}
    flags["london_baseline.py"] = flags_of(captured_parser(london_baseline.main, run.Parser))
    flags |= {f"addsub.py {c}": flags_of(addsub_parser(c)) for c in ("data", "train", "evaluate", "ask")}
    flags["play_char.py"] = flags_of(captured_parser(play_char.parse_args, play_char.Parser))
    flags["run.sh"] = run_sh_settings()
    return flags


FLAGS = entry_flags()


@pytest.mark.parametrize("entry", sorted(FLAGS))
def test_every_flag_of_every_entry_point_is_classified(entry):
    unclassified = sorted(FLAGS[entry] - set(KINDS.get(entry, {})))
    assert not unclassified, (
        f"{entry}: classify {unclassified} in KINDS of tests/test_hostile_suite.py (int, float, input, output, "
        "input_dir, output_dir, choice, switch or text), so that the suite tries hostile values on them"
    )


@pytest.mark.parametrize("entry", sorted(set(FLAGS) - {"run.sh"}))
def test_every_numeric_flag_is_classified_as_its_parsers_type(entry):
    parser = {
        **{f"run.py {c}": run.make_parser(c) for c in config.FUNCTIONS},
        **{f"addsub.py {c}": addsub_parser(c) for c in ("data", "train", "evaluate", "ask")},
        "play_char.py": captured_parser(play_char.parse_args, play_char.Parser),
        "london_baseline.py": captured_parser(london_baseline.main, run.Parser),
    }[entry]
    types = {a.dest: a.type for a in parser._actions}
    wrong = {f: k for f, k in KINDS[entry].items() if k in ("int", "float") and f in types and types[f] is not {"int": int,
             "float": float}[k]}  # fmt: skip
    assert not wrong, f"{entry}: {wrong} are not parsed as the kind KINDS gives them"


# ---------------------------------------------------------------------------
# Trying each hostile value


class PastChecks(BaseException):  # not an Exception: no `except Exception` of an entry point may take it
    """Raised where an entry point starts its work (builds a model, writes data): its checks let it through."""


def past_checks(*args, **kwargs):
    raise PastChecks


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Valid inputs for every entry point, outside the folder each case runs in."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "wiki.txt").write_text("".join(f"{n}. Born in {p} .\n" for n, p in PEOPLE), encoding="utf-8")
    (d / "train.tsv").write_text("".join(f"Where was {n} born?\t{p}\n" for n, p in PEOPLE), encoding="utf-8")
    (d / "model.params").write_bytes(b"params: read after the checks")
    (d / "text.txt").write_text("To be, or not to be: that is the question.\n" * 50, encoding="utf-8")
    addsub.write_splits(d / "splits")
    addsub.save_params(d / "addsub.params", addsub.AddSubTransformer(addsub.AddSubConfig(emb_dim=8, num_heads=1,
                       num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8)))  # fmt: skip
    sh = d / "sh"  # run.sh with a set-up that stops it: its checks come before
    sh.mkdir()
    shutil.copy(REPO_ROOT / "run.sh", sh / "run.sh")
    (sh / "setup.sh").write_text("exit 99\n")
    return d


def base_argv(entry: str, d: Path) -> list[str]:
    """A command line of `entry` that passes its checks."""
    corpus, params = str(d / "wiki.txt"), str(d / "model.params")
    return {
        "run.py pretrain": ["pretrain", "vanilla", corpus, "--writing_params_path", "out.params"],
        "run.py finetune": ["finetune", "vanilla", corpus, "--writing_params_path", "out.params",
                            "--finetune_corpus_path", str(d / "train.tsv")],
        "run.py evaluate": ["evaluate", "vanilla", corpus, "--reading_params_path", params, "--eval_corpus_path",
                            str(d / "train.tsv"), "--outputs_path", "out.predictions"],
        "run.py ask": ["ask", "vanilla", corpus, "--reading_params_path", params, "Where was Ada Lovelace born?"],
        "london_baseline.py": ["--eval_corpus_path", str(d / "train.tsv")],
        "addsub.py data": ["data", "--data_dir", "splits"],
        "addsub.py train": ["train", "--data_dir", str(d / "splits")],
        "addsub.py evaluate": ["evaluate", "--reading_params_path", str(d / "addsub.params"), "--data_dir",
                               str(d / "splits")],
        "addsub.py ask": ["ask", "12 + 30", "--reading_params_path", str(d / "addsub.params")],
        "play_char.py": ["--input", str(d / "text.txt"), "--prompt", "To be"],
    }[entry]  # fmt: skip


NEEDS = {  # flags that only apply together with others
    ("run.py finetune", "recite_chars"): ["--recite", "--reading_params_path", "{d}/model.params"],
    ("run.py pretrain", "finetune_corpus_path"): ["--mix_share", "0.2"],
}


def attempt(entry: str, flag: str, value: str, d: Path, monkeypatch) -> int | str:
    """`entry` run with --flag value: its exit code, or "past its checks" where it started its work."""
    if entry == "run.sh":
        env = {**os.environ, "OUT_DIR": str(Path.cwd() / "out"), flag: value}
        proc = subprocess.run(["bash", str(d / "sh" / "run.sh")], env=env, capture_output=True, text=True, timeout=60)
        print(proc.stdout, end="")
        print(proc.stderr, end="", file=sys.stderr)
        return "past its checks" if proc.returncode == 99 else proc.returncode
    argv = base_argv(entry, d)
    if flag == "pretrain_corpus_path":  # run.py's positional
        argv[2] = value
    else:
        argv += [f"--{flag}", value, *[a.format(d=d) for a in NEEDS.get((entry, flag), [])]]
    main = {"run.py": run.main, "london_baseline.py": london_baseline.main, "addsub.py": addsub.main,
            "play_char.py": play_char.main}[entry.split()[0]]  # fmt: skip
    for module, name in [(config, "GPT"), (london_baseline, "read_questions"), (addsub, "AddSubTransformer"),
                         (addsub, "split_expressions"), (play_char, "GPT")]:  # fmt: skip
        monkeypatch.setattr(module, name, past_checks)
    try:
        return main(argv)
    except PastChecks:
        return "past its checks"


def cases() -> list:
    found = []
    for entry, kinds in KINDS.items():
        for flag, kind in ((f, k) for f, k in kinds.items() if f in FLAGS[entry]):
            values = {v: v for v in NUMBERS} if kind in ("int", "float") else PATHS.get(kind, {})
            for name, path in values.items():
                gap = GAPS.get((entry, flag, name))
                marks = [pytest.mark.xfail(reason=gap, strict=True)] if gap else []
                found.append(pytest.param(entry, flag, name, path, id=f"{entry} {flag} {name}", marks=marks))
    return found


@pytest.fixture
def hostile_folder(tmp_path, monkeypatch):
    """The folder a case runs in, holding what hostile paths name: a folder, a FIFO and a regular file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "regular.txt").write_text("a file\n")
    threads = torch_threads()
    yield tmp_path
    torch_threads(threads)  # the demo sets its own


def torch_threads(n: int | None = None) -> int:
    import torch

    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(("entry", "flag", "name", "value"), cases())
def test_a_hostile_value_is_refused_in_one_line_before_any_work(
    entry, flag, name, value, files, hostile_folder, monkeypatch, capsys
):
    if value and value not in NUMBERS and not value.startswith("/"):
        value = str(hostile_folder / value)
    before = tree(hostile_folder)
    result = attempt(entry, flag, value, files, monkeypatch)
    err = capsys.readouterr().err
    reason = ALLOWED.get((entry, flag, name))
    if reason is not None:
        assert result in (0, "past its checks"), f"allowed ({reason}), but refused: {err}"
        return
    assert result == 2, f"{entry} --{flag} {value}: {result}, not refused; guard it, or allow it in ALLOWED\n{err}"
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert tree(hostile_folder) == before
