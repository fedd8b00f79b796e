"""Small shared helpers: user errors, device and precision, atomic file writes,
safe outputs, seeding, and finding data files."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import pickle
import platform
import random
import secrets
import shutil
import stat
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np
import torch


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit code 2, no traceback."""


# ---------------------------------------------------------------------------
# Device and precision, decided once


def pick_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda if available, else cpu; 'cuda' without a GPU is a UserError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but no CUDA GPU is available")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    """True where bf16 matmuls are native: recent CUDA GPUs, CPUs with AVX512-BF16/AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast (fp32 master weights) when enabled and supported, else a no-op."""
    if enabled and bf16_supported(device):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_states() -> dict:
    """The states of python's, numpy's and torch's generators (CPU and CUDA), as tensors and plain types."""
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


# ---------------------------------------------------------------------------
# Files: never half written


def _file_kind(mode: int) -> str:
    """What a stat mode that is not a regular file names, for error messages."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def write_target(path: str | Path) -> Path:
    """The file a write to `path` replaces: `path`, or through a symlink the file it points to.

    A UserError when that exists and is not a regular file (a folder, a device such
    as /dev/null, a FIFO): renaming onto it would replace it with a plain file.
    """
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        if target.is_symlink():  # realpath stops at a link it cannot follow: a loop
            raise UserError(f"{path}: a symlink that cannot be followed; give a file name") from None
        return target
    except OSError as e:
        raise UserError(f"{path}: cannot be inspected ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: is {_file_kind(mode)}, not a regular file; give a file name")
    return target


def check_output_file(path: str | Path | None, flag: str) -> None:
    """Fail before any work, not after hours of training, if an output cannot be written at `path`.

    A one-line UserError naming `flag` for a folder, anything else that is not a
    regular file (or a symlink to one), a missing folder or one without write permission.
    """
    if path is None:
        return
    if Path(path).is_dir():
        raise UserError(f"{flag} {path}: is a folder; give a file name")
    try:
        target = write_target(path)
    except UserError as e:
        raise UserError(f"{flag} {e}") from None
    parent = target.resolve().parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: folder {parent} is not writable (permission denied)")
    longest = _name_max(parent) - len(".ckpt")  # room for the files written beside it
    if len(os.fsencode(target.name)) > longest:
        raise UserError(f"{flag} {path}: the name is {len(os.fsencode(target.name))} bytes; at most {longest} fit")


def check_free_space(path: str | Path, needed: int, what: str) -> None:
    """A one-line UserError, before any work, when the file system that will hold `path` has fewer than
    `needed` bytes free for `what`."""
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
    """The start of the temporary names of writes to `target`: short enough for any name's temporary."""
    return "." + os.fsencode(target.name)[:200].decode(errors="ignore")


def stale_temporaries(target: Path) -> list[Path]:
    """The temporaries that writes to `target` by processes no longer running left behind (a kill during a
    write); a running process's temporary is not one."""
    stem = _temporary_stem(target)
    found = target.parent.glob(f"{glob.escape(stem)}.*-*.tmp")
    pids = {tmp: tmp.name[len(stem) + 1 :].split("-")[0] for tmp in found}
    return [tmp for tmp, pid in pids.items() if pid.isdigit() and not _running(int(pid))]


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is renamed onto `path`.

    A crash or error before the rename leaves any previous file at `path` intact.
    A symlink at `path` stays: the file it points to is replaced. Only a regular
    file is ever replaced (see write_target). A new file gets the mode the umask
    gives, a replaced one keeps its mode.
    """
    target = write_target(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: folder {parent} does not exist")
    old_mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    for stale in stale_temporaries(target):
        stale.unlink(missing_ok=True)
    while True:
        tmp = parent / f"{_temporary_stem(target)}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:  # 0o666: the kernel applies the umask, as for any new file (mkstemp would make it 0600)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
        except PermissionError:
            raise UserError(f"{path}: cannot write in folder {parent} (permission denied)") from None
        except OSError as e:
            raise UserError(f"{path}: cannot be written ({e.strerror})") from None
    os.close(fd)
    try:
        if old_mode is not None:
            os.chmod(tmp, old_mode)
        yield tmp
        _fsync(tmp)  # on disk before it is renamed into place: a crash leaves the old file or the new one
        os.replace(tmp, target)
    except OSError as e:  # a full disk, a quota: the old file stays
        raise UserError(f"{path}: cannot be written ({e.strerror}); the previous file, if any, is intact") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` as UTF-8 to `path` atomically (see atomic_path)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, obj: object) -> None:
    """Write `obj` as indented JSON to `path` atomically (see atomic_path)."""
    write_text_atomic(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def torch_save_atomic(obj: object, path: str | Path, before_rename: Callable[[Path], object] | None = None) -> None:
    """torch.save `obj` to `path` atomically (see atomic_path); once the temporary is written and on disk,
    `before_rename(temporary)` runs just before the rename (save_params writes the params' sidecar there)."""
    with atomic_path(path) as tmp:
        try:
            torch.save(obj, tmp)
        except RuntimeError as e:  # torch's writer reports a failed write (a full disk) this way, cryptically
            full = shutil.disk_usage(tmp.parent).free < 1 << 20
            raise (
                OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) if full else OSError(errno.EIO, str(e).splitlines()[0])
            ) from None
        if before_rename is not None:
            _fsync(tmp)
            before_rename(tmp)


def refuse_same_file(outputs: dict[str, str | Path | None], inputs: dict[str, str | Path | None]) -> None:
    """A one-line UserError when an output is the same file as an input or as another output.

    Keys are flag names (e.g. "--outputs_path"), values paths or None (not given).
    Paths are compared resolved (symlinks, "./x", "../d/x"), and with os.path.samefile
    where both exist (hard links).
    """
    given_outputs = [(flag, Path(p)) for flag, p in outputs.items() if p is not None]
    given_inputs = [(flag, Path(p)) for flag, p in inputs.items() if p is not None]
    for i, (flag, out) in enumerate(given_outputs):
        for other_flag, other in given_outputs[:i] + given_inputs:
            if _same_file(out, other):
                raise UserError(f"{flag} {out} is the same file as {other_flag}; choose another name")


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
    except (RuntimeError, OSError):  # a symlink loop: compare the names as given
        return a.absolute() == b.absolute()
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def torch_load_safe(path: str | Path) -> object:
    """torch.load with weights_only=True: tensors and plain containers only, never code."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickles; the error below says it once
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError:
        raise UserError(f"{path}: cannot be read (permission denied)") from None
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower():
            raise UserError(f"{path}: refused: it holds objects other than tensors, which could run code") from None
        raise UserError(f"{path}: not a params file written by torch.save, or a damaged one") from None
    except Exception:  # noqa: BLE001 - any other failure here is a bad file, not a bug
        raise UserError(f"{path}: not a params file written by torch.save, or a damaged one") from None


REPO_ROOT = Path(__file__).resolve().parents[1]


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def provenance(device: torch.device) -> dict:
    """Where a result was made: the commit of this checkout ("+changes" when files differ from it, None
    outside git), the CPU, the device, the threads and the versions of torch and Python."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit and commit + ("+changes" if changes else ""),
        "machine": {"cpu": cpu_info().get("model name") or platform.processor(), "device": str(device),
                    "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()},
    }  # fmt: skip


def cpu_info(path: str | Path = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "cpu family", "model", ...); {} without it."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def find_data_file(name: str | None, what: str) -> Path | None:
    """`name` as given if it exists; a bare name missing here is looked up in data/ (and we say so)."""
    if name is None:
        return None
    path = Path(name)
    if path.exists():
        if path.is_dir():
            raise UserError(f"{name}: {what} is a folder, expected a file")
        if not path.is_file():  # a FIFO without a writer would block the read forever
            raise UserError(f"{name}: {what} is not a regular file (a FIFO, device or socket); give a file")
        return path
    candidate = REPO_ROOT / "data" / path.name
    if path.parent == Path(".") and candidate.is_file():
        print(f"{what}: {name} is not in the current folder; using {candidate}")
        return candidate
    hint = " (run the data step: python data/get_data.py)" if path.parent == Path(".") else ""
    raise UserError(f"{name}: {what} not found{hint}")


class ScalarWriter(Protocol):
    """What the commands log to: a TensorBoard SummaryWriter."""

    def add_scalar(self, tag: str, value: float, step: int) -> None: ...
    def add_text(self, tag: str, text: str) -> None: ...
    def add_hparams(self, hparam_dict: dict, metric_dict: dict, run_name: str) -> None: ...
    def close(self) -> None: ...


@contextlib.contextmanager
def no_thread_tracebacks_for_os_errors() -> Iterator[None]:
    """Inside, a thread dying of an OSError (TensorBoard's writer on a full disk) prints nothing: the main
    thread meets the error at its next write and says it in one line."""
    previous = threading.excepthook
    threading.excepthook = lambda hook: issubclass(hook.exc_type, OSError) or previous(hook)
    try:
        yield
    finally:
        threading.excepthook = previous


class Progress:
    """Prints `what`'s progress, `update(done)` of `total`, as plain lines (logs show them) at most every `every`
    seconds; the time left is estimated from after the first update, which pays one-time costs."""

    def __init__(self, what: str, total: int, every: float = 20.0):
        self.what, self.total, self.every = what, total, every
        self.start = self.printed = time.monotonic()
        self.first: tuple[float, int] | None = None  # (time, done) at the first update

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.first is None or done <= self.first[1]:
            self.first = self.first or (now, done)
            return
        if now - self.printed < self.every or done >= self.total:
            return
        self.printed = now
        left = (now - self.first[0]) / (done - self.first[1]) * (self.total - done)
        print(f"{self.what}: {done}/{self.total} after {now - self.start:.0f} s, about {left:.0f} s left", flush=True)
