"""Params files: a plain state_dict (loadable by the handout's model) and a JSON sidecar beside it that says what model
it fits and the SHA-256 of the params' bytes; loading checks both and refuses any other model in one line. AddSub and
the demo save their params the same way (save_with_sidecar, load_verified)."""

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

MODEL_SIZES = ("n_layer", "n_head", "n_embd", "bottleneck_dim")  # the settings a GPT is built with, as sidecars say


def sidecar_path(params_path: str | Path) -> Path:
    """The JSON sidecar beside a params file: `<params>.json`."""
    return Path(f"{params_path}.json")


def save_with_sidecar(obj: object, path: str | Path, sidecar: dict) -> None:
    """torch.save `obj` to `path` with `sidecar` and the params' SHA-256 in `<path>.json`, both atomically.
    The sidecar is renamed into place first: a kill between the two leaves the params in their temporary,
    where read_sidecar finds them."""
    with contextlib.suppress(UserError):
        read_sidecar(path)  # finishes a killed save before its temporary is removed as stale

    def write_sidecar(tmp: Path) -> None:
        write_json_atomic(sidecar_path(path), {**sidecar, "params_sha256": file_sha256(tmp)})

    torch_save_atomic(obj, path, write_sidecar)


def read_sidecar(path: str | Path) -> dict | None:
    """The JSON sidecar of a params file, or None if it has none; first finishes a save a kill interrupted."""
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
    """Rename onto params file `path` the temporary a killed save left with the params of SHA-256 `sha256`
    (its sidecar's), unless `path` holds those already; a one-line note on stderr says so."""
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
    """(what torch.save wrote to `path`, its sidecar, its SHA-256), after checking the file against the
    sidecar's SHA-256; params whose sidecar names none (from before hashes, or without a sidecar) cannot be
    verified: warn_unverified says so once they are used."""
    side = read_sidecar(path) or {}  # first: it may finish a killed save
    sha256 = file_sha256(check_input(path, flag))
    if isinstance(side.get("params_sha256"), str) and side["params_sha256"] != sha256:
        raise UserError(f"{flag} {path}: damaged or replaced: its bytes do not match the SHA-256 its sidecar "
                        f"{sidecar_path(path).name} records; train them again".lstrip())  # fmt: skip
    return torch_load_safe(path, flag), side, sha256


def warn_unverified(path: str | Path, side: dict) -> None:
    """One line on stderr when params loaded by load_verified had no SHA-256 to be checked against."""
    if not isinstance(side.get("params_sha256"), str):
        print(f"warning: {path}: no SHA-256 in a sidecar beside it, so its bytes cannot be verified", file=sys.stderr)


def model_description(config: GPTConfig, vocab: Vocabulary) -> dict:
    """What a params file must agree on to be loaded: stored beside it as JSON."""
    sizes = ("variant", "bottleneck_dim", "block_size", "n_layer", "n_head", "n_embd", "vocab_size")
    description = {key: getattr(config, key) for key in sizes} | {"vocab": "".join(vocab.itos)}
    if config.variant != "perceiver":  # only the perceiver has a bottleneck
        description["bottleneck_dim"] = None
    return description


def save_params(model: GPT, vocab: Vocabulary, path: str, extra: dict) -> None:
    """Save `model`'s params to `path`, a plain state_dict the handout's model loads, with a sidecar of what loading
    checks (model_description), the GPTConfig as used under "model", and `extra`."""
    description = {**model_description(model.config, vocab), "model": asdict(model.config), **extra}
    save_with_sidecar({k: v.detach().cpu() for k, v in model.state_dict().items()}, path, description)


def stored_sizes(path: str | None, flag: str) -> dict:
    """The MODEL_SIZES the sidecar of params file `path` records, to build a model as trained; {} without a sidecar."""
    side = (read_sidecar(path) if path is not None else None) or {}
    sizes = {k: side[k] for k in MODEL_SIZES if side.get(k) is not None}
    for key, value in sizes.items():
        if type(value) is not int or value < 1:
            raise UserError(f"{flag} {path}: its sidecar gives {key} {value!r}; a model needs a whole number >= 1")
    return sizes


def load_params(model: GPT, vocab: Vocabulary, path: str) -> str:
    """Load `path` into `model` (a one-line error naming the mismatch for another model's); returns its SHA-256."""
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
        problem = (f"params look like a {kind} model, this run builds a {want['variant']} one (missing "
                   f"{missing[:3]}, unexpected {unexpected[:3]})")  # fmt: skip
    elif (key := next((k for k, v in state.items() if v.shape != expected[k].shape), None)) is not None:
        problem = (f"{key} has shape {tuple(state[key].shape)}, this model needs {tuple(expected[key].shape)} "
                   "(another bottleneck_dim, vocabulary or model size?)")  # fmt: skip
    elif (key := next((k for k, v in state.items() if not v.isfinite().all()), None)) is not None:
        problem = f"{key} holds NaN or infinite weights: these params cannot answer or train"
    else:
        model.load_state_dict(state)
        warn_unverified(path, have)
        return sha256
    raise UserError(f"{path}: {problem}")
