"""Params files: a plain state_dict, which the handout's model loads, and a JSON sidecar recording the model it fits
and its bytes' SHA-256, both checked on loading; AddSub's and the demo's too."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from dataset import Vocabulary
from model import GPT, GPTConfig
from utils import (
    UserError,
    check_input,
    file_sha256,
    stale_temporaries,
    torch_load_safe,
    torch_save_atomic,
    write_json_atomic,
)

MODEL_SIZES = ("n_layer", "n_head", "n_embd", "bottleneck_dim")  # the sizes a GPT is built with


def sidecar_path(params_path: str | Path) -> Path:
    """The path of a params file's JSON sidecar."""
    return Path(f"{params_path}.json")


def save_with_sidecar(obj: object, path: str | Path, sidecar: dict) -> None:
    """torch.save `obj` to `path`, and `sidecar` with its SHA-256 to `<path>.json`, atomically. The sidecar goes
    first: after a kill between the two, read_sidecar finds the params in their temporary."""
    with contextlib.suppress(UserError):
        read_sidecar(path)  # finishes a killed save before its temporary is removed as stale

    def write_sidecar(tmp: Path) -> None:
        write_json_atomic(sidecar_path(path), {**sidecar, "params_sha256": file_sha256(tmp)})

    torch_save_atomic(obj, path, write_sidecar)


def read_sidecar(path: str | Path) -> dict | None:
    """The JSON sidecar of a params file, or None; first finishes a killed save."""
    side = sidecar_path(path)
    if not os.path.isfile(side):
        return None
    try:
        description = json.loads(check_input(side, "").read_text(encoding="utf-8"))
        problem = "" if isinstance(description, dict) else "not a params sidecar (JSON, but expected an object)"
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        problem = f"unreadable sidecar ({e})"
    except OSError as e:
        problem = f"the params' sidecar cannot be read ({e.strerror})"
    if problem:
        raise UserError(f"{side}: {problem}; delete or fix it")
    finish_killed_save(Path(path), description.get("params_sha256"))
    return description


def finish_killed_save(path: Path, sha256: object) -> None:
    """Rename onto `path` (saying so) the temporary a killed save left with SHA-256 `sha256`, unless `path` has it."""
    if not sha256:
        return
    target = Path(os.path.realpath(path))  # through a symlink, as the save wrote it
    tmp = next((tmp for tmp in stale_temporaries(target) if file_sha256(tmp) == sha256), None)
    if tmp is None or (target.is_file() and file_sha256(target) == sha256):
        return
    try:
        os.replace(tmp, target)
    except OSError as e:
        raise UserError(f"{path}: cannot finish the save a kill interrupted ({e.strerror})") from None
    print(f"note: {path}: finished the save a kill interrupted, from {tmp.name}", file=sys.stderr)


def load_verified(path: str | Path, flag: str = "") -> tuple[object, dict, str]:
    """(what torch.save wrote to `path`, its sidecar, its SHA-256), checked against the sidecar's if it has one."""
    side = read_sidecar(path) or {}  # first: it may finish a killed save
    sha256 = file_sha256(check_input(path, flag))
    if isinstance(side.get("params_sha256"), str) and side["params_sha256"] != sha256:
        raise UserError(
            f"{flag} {path}: damaged or replaced: its bytes do not match the SHA-256 its sidecar "
            f"{sidecar_path(path).name} records; train them again".lstrip()
        )
    return torch_load_safe(path, flag), side, sha256


def warn_unverified(path: str | Path, side: dict) -> None:
    """Warn when params from load_verified had no SHA-256 to check."""
    if not isinstance(side.get("params_sha256"), str):
        print(f"warning: {path}: no SHA-256 in a sidecar beside it, so its bytes cannot be verified", file=sys.stderr)


def model_description(config: GPTConfig, vocab: Vocabulary) -> dict:
    """What a params file's sidecar must agree on to load."""
    sizes = ("variant", "bottleneck_dim", "block_size", "n_layer", "n_head", "n_embd", "vocab_size")
    description = {key: getattr(config, key) for key in sizes} | {"vocab": "".join(vocab.itos)}
    if config.variant != "perceiver":  # only the perceiver has a bottleneck
        description["bottleneck_dim"] = None
    return description


def save_params(model: GPT, vocab: Vocabulary, path: str, extra: dict) -> None:
    """`model`'s params to `path`, a plain state_dict, with a sidecar of model_description, "model" (the GPTConfig)
    and `extra`."""
    description = {**model_description(model.config, vocab), "model": asdict(model.config), **extra}
    save_with_sidecar({k: v.detach().cpu() for k, v in model.state_dict().items()}, path, description)


def stored_sizes(path: str | None, flag: str) -> dict:
    """The MODEL_SIZES the sidecar of `path` records, to build the model as trained; {} without one."""
    side = path and read_sidecar(path) or {}
    sizes = {k: side[k] for k in MODEL_SIZES if side.get(k) is not None}
    for key, value in sizes.items():
        if type(value) is not int or value < 1:
            raise UserError(f"{flag} {path}: its sidecar gives {key} {value!r}; a model needs a whole number >= 1")
    return sizes


def finite_logits(model: GPT, state: dict) -> bool:
    """Load `state` into `model`; whether its logits over a block are finite (in eval mode: no random numbers)."""
    model.load_state_dict(state)
    training = model.training
    with torch.no_grad():
        finite = bool(model.eval()(torch.zeros(1, model.config.block_size, dtype=torch.long))[0].isfinite().all())
    model.train(training)
    return finite


def load_params(model: GPT, vocab: Vocabulary, path: str) -> str:
    """Load `path` into `model` and return its SHA-256; another model's params get a one-line error."""
    state, have, sha256 = load_verified(path)
    want, expected = model_description(model.config, vocab), model.state_dict()
    key = next((k for k in want if k in have and have[k] != want[k]), None)
    if key is not None:
        shown = "differs" if key == "vocab" else f"is {have[key]!r}, this run needs {want[key]!r}"
        problem = f"params do not fit this model: {key} {shown} (from {sidecar_path(path).name})"
    elif not (isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())):
        problem = "not a state_dict of tensors"
    elif state.keys() != expected.keys():
        kind = "perceiver" if "down_block.C" in state else "vanilla" if "pos_emb" in state else "rope"
        missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
        problem = (
            f"params look like a {kind} model, this run builds a {want['variant']} one (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]})"
        )
    elif (key := next((k for k, v in state.items() if v.shape != expected[k].shape), None)) is not None:
        problem = (
            f"{key} has shape {tuple(state[key].shape)}, this model needs {tuple(expected[key].shape)} "
            "(another bottleneck_dim, vocabulary or model size?)"
        )
    elif not finite_logits(model, state):
        problem = "its weights give NaN or infinite logits: these params cannot answer or train"
    else:
        warn_unverified(path, have)
        if "vocab" not in have:  # another of the same size would decode garbage
            print(
                f"warning: {path}: its sidecar records no vocabulary; use the corpus it was trained on", file=sys.stderr
            )
        return sha256
    raise UserError(f"{path}: {problem}")
