"""Small shared helpers: user errors, settings, seeding, checked and atomic file I/O, data files."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import io
import json
import math
import os
import pickle
import platform
import random
import secrets
import shutil
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit code 2, no traceback."""


class TrainingInterrupted(Exception):
    """Raised once a stop signal's checkpoint is written; carries its path."""


# Settings: a dataclass field per flag, with its rule beside it


def setting(default: Any, help: str | None, **rule_and_options: Any) -> Any:
    """A dataclass field for a flag: its --help text, rule (at_least, above, at_most) and parser options."""
    return field(default=default, metadata={"help": help, **rule_and_options})


def setting_problems(settings: object) -> Iterator[str]:
    """'--name must be ..., got value' for each number in `settings` that breaks its rule."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        low, above, high = (f.metadata.get(k) for k in ("at_least", "above", "at_most"))
        if isinstance(value, bool) or not isinstance(value, int | float) or {low, above, high} == {None}:
            continue
        if not (
            math.isfinite(value)
            and (low is None or value >= low)
            and (above is None or value > above)
            and (high is None or value <= high)
        ):
            words = "a positive number" if above == 0 else f"above {above}" if above is not None else ""
            words = words or (f"between {low} and {high}" if high is not None else f"at least {low}")
            yield f"--{f.name} must be {words}, got {value}"


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_states() -> dict:
    """The random generators' states, as tensors and plain types for a checkpoint."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states: dict) -> None:
    """Restore what rng_states returned (after a torch.load)."""
    random.setstate((states["python"][0], tuple(states["python"][1]), states["python"][2]))
    np.random.set_state((states["numpy"][0], states["numpy"][1].numpy().astype(np.uint32), *states["numpy"][2:]))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# Files: never half written


def _file_kind(mode: int) -> str:
    kinds = {"d": "a folder", "c": "a device", "b": "a device", "p": "a FIFO", "s": "a socket", "-": "a file"}
    return kinds.get(stat.filemode(mode)[0], "not a regular file")  # filemode: "drwxr-xr-x"


def _why(e: OSError) -> str:
    """An OSError's cause, for a one-line error."""
    return {
        errno.ENOENT: "not found",
        errno.ENAMETOOLONG: "a name too long for the file system",
        errno.ELOOP: "a symlink loop",
        errno.ENOTDIR: "a path through something that is not a folder",
        errno.EACCES: "permission denied",
    }.get(e.errno, e.strerror or str(e))


def check_path_given(path: str | Path | None, flag: str) -> None:
    """A one-line UserError naming `flag` when `path` is "" (the current folder)."""
    if path == "":
        raise UserError(f"{flag} is empty; give a path")


def check_input(path: str | Path, flag: str, hint: str = "") -> Path:
    """`path` if it is a readable regular file, else a one-line UserError naming `flag`, the cause and `hint` (a FIFO
    without a writer would block forever)."""
    try:
        mode = os.stat(path).st_mode
        cause = "" if stat.S_ISREG(mode) else f"is {_file_kind(mode)}, not a regular file"
        cause = cause or ("" if os.access(path, os.R_OK) else "cannot be read (permission denied)")
    except OSError as e:
        cause = _why(e)
    except ValueError:  # a NUL character
        cause = "not a file name"
    if cause:
        raise UserError(f"{flag} {path}: {cause}{hint}".lstrip())
    return Path(path)


def write_target(path: str | Path, flag: str = "") -> Path:
    """The file a write to `path` replaces (a symlink's target); a UserError naming `flag` if that is not a regular
    file (a rename would replace /dev/null) or cannot be reached."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    try:
        mode = os.stat(target).st_mode
        cause = "" if stat.S_ISREG(mode) else f"is {_file_kind(mode)}, not a regular file; give a file name"
    except FileNotFoundError:  # realpath stops at a link it cannot follow
        cause = "a symlink that cannot be followed; give a file name" if os.path.islink(target) else ""
    except OSError as e:
        cause = _why(e)
    if cause:
        raise UserError(f"{flag} {path}: {cause}".lstrip())
    return target


def check_output_file(path: str | Path | None, flag: str) -> None:
    """A one-line UserError naming `flag` if no file, and no .ckpt beside it, can be written at `path` (None:
    not given)."""
    if path is None:
        return
    parent = write_target(path, flag).parent  # as the system reads it: "x/../p" needs a folder x
    name = len(os.fsencode(Path(path).name))
    cause = "" if os.path.isdir(parent) else f"folder {parent} does not exist"
    if not cause and not os.access(parent, os.W_OK | os.X_OK):
        cause = f"folder {parent} is not writable (permission denied)"
    if not cause and name > (room := _name_max(parent) - len(".ckpt")):
        cause = f"the name is {name} bytes; at most {room} fit (room for the .ckpt beside it)"
    if cause:
        raise UserError(f"{flag} {path}: {cause}")


def check_output_dir(path: str | Path, flag: str) -> None:
    """A one-line UserError naming `flag` unless `path` is a folder this process can write in or make."""
    missing = folders_to_make(path)
    folder = missing[-1].parent if missing else Path(path)  # the part that exists; the rest is made
    try:
        mode = os.stat(folder).st_mode
        cause = "" if stat.S_ISDIR(mode) else f"{folder} is not a folder ({_file_kind(mode)}); give a folder name"
        if not cause and not os.access(folder, os.W_OK | os.X_OK):
            cause = f"folder {folder} is not writable (permission denied)"
        if not cause and any(len(os.fsencode(part)) > _name_max(folder) for part in Path(path).parts):
            cause = "a name too long for the file system"
        if not cause and len(os.fsencode(os.path.abspath(path))) >= os.pathconf(folder, "PC_PATH_MAX"):
            cause = "a path too long for the file system"
    except OSError as e:
        cause = _why(e)
    if cause:
        raise UserError(f"{flag} {path}: {cause}")


def folders_to_make(folder: str | Path) -> list[Path]:
    """The folders making `folder` would create, innermost first (a failed run removes only these)."""
    missing, folder = [], Path(folder)
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def physical_memory() -> float:
    """This machine's memory in bytes, or inf if unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return math.inf


def training_memory_problem(parameters: int, sizes: str, extra_bytes: int = 0) -> str | None:
    """Why a model of `parameters` parameters (flags `sizes`) cannot train here, else None: 16 bytes a parameter
    (fp32 weights, gradients, AdamW's moments) plus `extra_bytes`."""
    need, have = 16 * parameters + extra_bytes, physical_memory()
    return (
        f"{sizes}: {need / 2**30:,.0f} GiB to train; this machine has {have / 2**30:,.0f} GiB" if need > have else None
    )


def write_failure(e: OSError, path: str | Path) -> UserError:
    """The one-line error for an OSError while writing `path`."""
    return UserError(f"{e.filename or path}: cannot be written ({e.strerror or e})")


def run_cli(parse: Callable[[], Any], work: Callable[[Any], object]) -> int:
    """A small CLI's entry point, work(parse()): argparse's exit code, or 2 after a one-line UserError."""
    try:
        settings = parse()
    except SystemExit as e:
        return int(e.code or 0)
    try:
        work(settings)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def check_free_space(path: str | Path, needed: int, what: str) -> None:
    """A one-line UserError if `path`'s file system has under `needed` bytes free for `what`."""
    folder = Path(path).resolve().parent
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise UserError(f"{folder}: {free / 1e6:,.1f} MB free; {what} need about {needed / 1e6:,.0f} MB")


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _temporary_stem(target: Path) -> str:
    """A temporary name's start for `target`, short enough for any name."""
    return "." + os.fsencode(target.name)[:200].decode(errors="ignore")


def stale_temporaries(target: Path) -> list[Path]:
    """Temporaries for `target` left by processes no longer running (killed mid-write)."""
    stem = _temporary_stem(target)
    found = target.parent.glob(f"{glob.escape(stem)}.*-*.tmp")
    pids = {tmp: tmp.name[len(stem) + 1 :].split("-")[0] for tmp in found}
    return [tmp for tmp, pid in pids.items() if pid.isdigit() and not _running(int(pid))]


def _running(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # another user's process
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path`, renamed onto it on success: a crash or error leaves the previous file intact.
    A symlink at `path` stays and its target is replaced; a replaced file keeps its mode."""
    target = write_target(path)
    parent = target.parent
    old_mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    for stale in stale_temporaries(target):
        stale.unlink(missing_ok=True)
    tmp = parent / f"{_temporary_stem(target)}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        # 0o666 less the umask, as for any new file (mkstemp would make it 0600)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        if old_mode is not None:
            os.chmod(tmp, old_mode)
        yield tmp
        _fsync(tmp)  # on disk before the rename, so a crash leaves the old file or the new one
        os.replace(tmp, target)
    except OSError as e:
        cause = _why(e) if os.path.isdir(parent) else f"folder {parent} does not exist"
        raise UserError(f"{path}: cannot be written ({cause}); the previous file, if any, is intact") from None
    finally:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` as UTF-8, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, obj: object) -> None:
    """Write `obj` to `path` as indented JSON, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def torch_save_atomic(
    obj: object, path: str | Path, before_rename: Callable[[Path], object] | None = None, sealed: bool = False
) -> None:
    """torch.save `obj` to `path` atomically; `before_rename(temporary)` runs once it is on disk. `sealed` adds the
    bytes' SHA-256 for torch_load_safe to check."""
    if sealed:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = buffer.getvalue()
        obj = {
            "sealed": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
    with atomic_path(path) as tmp:
        try:
            torch.save(obj, tmp)
        except RuntimeError as e:  # how torch reports a failed write, such as a full disk
            code = errno.ENOSPC if shutil.disk_usage(tmp.parent).free < 1 << 20 else errno.EIO
            raise OSError(code, os.strerror(code) if code == errno.ENOSPC else str(e).splitlines()[0]) from None
        if before_rename is not None:
            _fsync(tmp)
            before_rename(tmp)


def refuse_same_file(outputs: dict[str, str | Path | None], inputs: dict[str, str | Path | None]) -> None:
    """A one-line UserError when an output is the same file as an input or another output, even through links
    ({flag: path or None})."""
    outs, ins = ([(flag, Path(p)) for flag, p in d.items() if p is not None] for d in (outputs, inputs))
    for i, (flag, out) in enumerate(outs):
        for other_flag, other in outs[:i] + ins:
            if _same_file(out, other):
                raise UserError(f"{flag} {out} is the same file as {other_flag}; choose another name")


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
    except (RuntimeError, OSError):  # a symlink loop: compare the names as given
        return a.absolute() == b.absolute()
    with contextlib.suppress(OSError):  # one of them does not exist (yet)
        return os.path.samefile(a, b)
    return False


def torch_load_safe(path: str | Path, flag: str = "") -> object:
    """torch.load of tensors and plain containers only, never code; a sealed file is checked and unsealed."""
    check_input(path, flag)
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickles; the error below says it once
            warnings.simplefilter("ignore", UserWarning)
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if not (isinstance(obj, dict) and obj.keys() == {"sealed", "sha256"}):
                return obj
            payload = obj["sealed"].numpy().tobytes()
            if hashlib.sha256(payload).hexdigest() == obj["sha256"]:
                return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
            why = "damaged: its bytes do not match the SHA-256 it was written with"
    except Exception as e:  # noqa: BLE001 - any failure here is a bad file, not a bug
        why = "not a file written by torch.save, or a damaged one"
        if isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower():
            why = "refused: it holds objects other than tensors, which could run code"
    raise UserError(f"{flag} {path}: {why}".lstrip())


REPO_ROOT = Path(__file__).resolve().parents[1]


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, in hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def provenance(device: torch.device) -> dict:
    """This checkout's commit ("+changes" if files differ; None outside git) and the machine."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit and commit + ("+changes" if changes else ""),
        "machine": {
            "cpu": cpu_info().get("model name") or platform.processor(),
            "device": str(device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }


def cpu_info(path: str | Path = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo; {} without it."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def locate_data(name: str | Path) -> Path:
    """Data file `name` as given, or data/'s when a bare name is missing here."""
    path, candidate = Path(name), REPO_ROOT / "data" / Path(name).name
    missing = not os.path.lexists(path) and path.parent == Path(".")
    return candidate if missing and os.path.isfile(candidate) else path


def find_data_file(name: str | Path, flag: str) -> Path:
    """locate_data's file, checked as an input; said when it is data/'s."""
    path = locate_data(name)
    if path != Path(name):
        print(f"{flag}: {name} is not in the current folder; using {path}")
    missing = Path(name).parent == Path(".") and not os.path.lexists(path)
    return check_input(path, flag, " (run the data step: python data/get_data.py)" if missing else "")


def crop_width(used: int, width: int) -> int:
    """`used` rounded up to a multiple of 8, at most `width`. With exact widths, the CPU allocator fragmented
    and steps slowed (bench/RESEARCH.md)."""
    return min(width, -(-used // 8) * 8)


def plural(n: int, word: str) -> str:
    """'1 epoch', '2 epochs'."""
    return f"{n} {word}{'s' if n != 1 else ''}"


@contextlib.contextmanager
def no_thread_tracebacks_for_os_errors() -> Iterator[None]:
    """Inside, a thread dying of an OSError prints nothing; the main thread meets the error and reports it."""
    previous = threading.excepthook
    threading.excepthook = lambda hook: issubclass(hook.exc_type, OSError) or previous(hook)
    try:
        yield
    finally:
        threading.excepthook = previous


def epoch_line_due(epoch: int, max_epochs: int) -> bool:
    """Whether epoch (1-based) gets a line: the first, the last, each completing a tenth of the run."""
    return epoch <= 1 or epoch >= max_epochs or epoch * 10 // max_epochs > (epoch - 1) * 10 // max_epochs


class Progress:
    """Prints `what`'s progress, `update(done)` of `total`, at most every `every` seconds; the time left from the
    first update on (it pays one-time costs)."""

    def __init__(self, what: str, total: int, every: float = 20.0):
        self.what, self.total, self.every = what, total, every
        self.start = self.printed = time.monotonic()
        self.first: tuple[float, int] | None = None  # (time, done) at the first update

    def update(self, done: int) -> None:
        now = time.monotonic()
        self.first = self.first or (now, done)
        if done <= self.first[1] or now - self.printed < self.every or done >= self.total:
            return
        self.printed = now
        left = (now - self.first[0]) / (done - self.first[1]) * (self.total - done)
        print(f"{self.what}: {done}/{self.total} after {now - self.start:.0f} s, about {left:.0f} s left", flush=True)
