"""Params files: a plain state_dict (loadable by the handout's model) and a JSON sidecar
beside it that says what model it fits; loading refuses any other model in one line."""

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
from utils import UserError, file_sha256, stale_temporaries, torch_load_safe, torch_save_atomic, write_json_atomic


def sidecar_path(params_path: str | Path) -> Path:
    """The JSON sidecar beside a params file: `<params>.json`."""
    return Path(f"{params_path}.json")


def model_description(config: GPTConfig, vocab: Vocabulary) -> dict:
    """What a params file must agree on to be loaded: stored beside it as JSON."""
    sizes = ("variant", "bottleneck_dim", "block_size", "n_layer", "n_head", "n_embd", "vocab_size")
    description = {key: getattr(config, key) for key in sizes} | {"vocab": "".join(vocab.itos)}
    if config.variant != "perceiver":  # only the perceiver has a bottleneck
        description["bottleneck_dim"] = None
    return description


def save_params(model: GPT, vocab: Vocabulary, path: str, extra: dict) -> None:
    """A plain state_dict (loadable by the handout model) plus a JSON sidecar describing it:
    what loading checks (model_description), the GPTConfig as used under "model", and `extra`.
    The sidecar, naming the new params' SHA-256, is renamed into place before the params: a kill
    between the two leaves them in their temporary, where read_sidecar finds them."""
    with contextlib.suppress(UserError):
        read_sidecar(path)  # finishes a killed save before its temporary is removed as stale
    description = {**model_description(model.config, vocab), "model": asdict(model.config)}

    def write_sidecar(tmp: Path) -> None:
        write_json_atomic(sidecar_path(path), {**description, "params_sha256": file_sha256(tmp), **extra})

    torch_save_atomic({k: v.detach().cpu() for k, v in model.state_dict().items()}, path, write_sidecar)


def read_sidecar(path: str | Path) -> dict | None:
    """The JSON sidecar of a params file, or None if it has none; first finishes a save a kill interrupted."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        description = json.loads(side.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{side}: unreadable sidecar ({e})") from None
    except OSError as e:
        raise UserError(f"{side}: the params' sidecar cannot be read ({e.strerror})") from None
    if not isinstance(description, dict):
        kinds = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}
        kind = kinds.get(type(description), "a number")
        raise UserError(f"{side}: not a params sidecar (JSON {kind}, expected an object); delete or fix it")
    finish_killed_save(Path(path), description.get("params_sha256"))
    return description


def finish_killed_save(path: Path, sha256: object) -> None:
    """Rename onto params file `path` the temporary a killed save left with the params of SHA-256 `sha256`
    (its sidecar's), unless `path` holds those already; a one-line note on stderr says so."""
    target = Path(os.path.realpath(path))  # through a symlink, as the save wrote it
    for tmp in stale_temporaries(target) if sha256 else []:
        if file_sha256(tmp) == sha256 and not (target.is_file() and file_sha256(target) == sha256):
            try:
                os.replace(tmp, target)
            except OSError as e:
                raise UserError(f"{path}: cannot finish the save a kill interrupted ({e.strerror})") from None
            print(f"note: {path}: finished the save a kill interrupted, from {tmp.name}", file=sys.stderr)
            return


def stored_sizes(path: str | None, flag: str) -> dict:
    """The model sizes (n_layer, n_head, n_embd, bottleneck_dim) the sidecar of params file `path`
    records, so that a model is built as it was trained; empty without a path or sidecar."""
    side = read_sidecar(path) if path is not None else None
    if side is None:
        return {}
    sizes = {k: side[k] for k in ("n_layer", "n_head", "n_embd", "bottleneck_dim") if side.get(k) is not None}
    for key, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{flag} {path}: its sidecar gives {key} {value!r}; a model needs a whole number >= 1")
    return sizes


def load_params(model: GPT, vocab: Vocabulary, path: str) -> str:
    """Load `path` into `model` (a one-line error naming the mismatch for another model's); returns its SHA-256."""
    p = Path(path)
    have = read_sidecar(p) or {}  # first: it may finish a killed save
    if not p.is_file():
        raise UserError(f"{path}: params file not found")
    want = model_description(model.config, vocab)
    for key in want:
        if key in have and have[key] != want[key]:
            shown = "differs" if key == "vocab" else f"is {have[key]!r}, this run needs {want[key]!r}"
            raise UserError(f"{path}: params do not fit this model: {key} {shown} (from {sidecar_path(p).name})")
    sha256 = file_sha256(p)
    if have.get("params_sha256", sha256) != sha256:
        raise UserError(f"{path}: its sidecar {sidecar_path(p).name} describes other params (a write of the two "
                        "was interrupted?); train them again")  # fmt: skip
    state = torch_load_safe(p)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: not a state_dict of tensors")
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        kind = "perceiver" if "down_block.C" in state else "vanilla" if "pos_emb" in state else "rope"
        raise UserError(f"{path}: params look like a {kind} model, this run builds a {want['variant']} one "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")  # fmt: skip
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise UserError(f"{path}: {k} has shape {tuple(v.shape)}, this model needs {tuple(expected[k].shape)} "
                            "(another bottleneck_dim, vocabulary or model size?)")  # fmt: skip
    model.load_state_dict(state)
    return sha256
