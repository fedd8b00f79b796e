"""The tests that compute, run again under the kernels other users' CPUs get (test.sh calls this after the suite).

torch picks its kernels by what the CPU has; two settings hold them lower: ATEN_CPU_CAPABILITY (ATen's own
vectorised kernels) and ONEDNN_MAX_CPU_ISA (oneDNN's, which run bf16 matmuls among others). Each setting below is
checked to have taken effect before its tests run, and a setting that did not is a failure. A CPU cannot emulate an
instruction set it lacks: such a setting is skipped, saying so, and one that equals this CPU's own (the suite just
ran it) is not run twice.

    python tests/kernel_matrix.py            (extra arguments go to every pytest run)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Numerics, optimizer, trainer, model and decoding: what a kernel or the thread count could change; and the machine
# policy, which a kernel could.
NUMERICS = [
    "test_attention.py",
    "test_model.py",
    "test_optim.py",
    "test_trainer.py",
    "test_recite.py",
    "test_confidence.py",
    "test_course_models.py",
    "test_dataset.py",
]
COMPUTING = [*NUMERICS, "test_budget.py", "test_machine.py"]
# (name, ATen capability, oneDNN ISA, threads): each a kind of CPU users have.
SETTINGS = [
    ("AVX2 only (Zen 3, Haswell to Skylake clients)", "avx2", "AVX2", None),
    ("AVX-512 without bf16 (Skylake-SP, Cascade Lake)", "avx512", "AVX512_CORE", None),
    ("no vector extensions past SSE4.1 (ATen's default kernels)", "default", "SSE41", None),
    ("ATen's default kernels on one thread", "default", "SSE41", 1),
]
ATEN_RANK = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}
ONEDNN_RANK = {"SSE4.1": 0, "AVX2": 1, "AVX-512": 2, "AVX-512 with bf16": 3, "AMX": 4}
ONEDNN_NAME = {"SSE41": "SSE4.1", "AVX2": "AVX2", "AVX512_CORE": "AVX-512"}
PROBE = """
import torch
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
    torch.nn.Conv2d(16, 16, 3)(torch.randn(2, 16, 16, 16))  # a oneDNN primitive: its first use names the ISA
print("aten", torch.backends.cpu.get_cpu_capability())
"""


def kernels(env: dict[str, str]) -> tuple[str, str]:
    """(ATen's capability, oneDNN's ISA) that a torch process started with `env` runs."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    aten = next(line.split()[1] for line in out.splitlines() if line.startswith("aten "))
    isa = next(line.split("isa:", 1)[1] for line in out.splitlines() if "isa:" in line)
    return aten, onednn_level(isa)


def onednn_level(isa: str) -> str:
    """oneDNN's verbose ISA line ("Intel AVX-512 with Intel DL Boost and bfloat16 support", ...) as a key of
    ONEDNN_RANK."""
    if "AMX" in isa:
        return "AMX"
    if "AVX-512" in isa:
        return "AVX-512 with bf16" if "bfloat16" in isa else "AVX-512"
    return "AVX2" if "AVX2" in isa else "SSE4.1"


def main(pytest_args: list[str]) -> int:
    base = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    native = kernels(base)
    print(f"kernel matrix: this CPU runs ATen {native[0]} and oneDNN {native[1]} kernels")
    failed = []
    for name, aten, isa, threads in SETTINGS:
        want = (aten.upper(), ONEDNN_NAME[isa])
        if ATEN_RANK[want[0]] > ATEN_RANK[native[0]] or ONEDNN_RANK[want[1]] > ONEDNN_RANK[native[1]]:
            print(f"kernel matrix: {name}: skipped, this CPU lacks it (run the suite on one that has it)")
            continue
        if want == native and threads is None:
            print(f"kernel matrix: {name}: this CPU's own kernels, which the suite just ran")
            continue
        env = {**base, "ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": isa}
        if threads:
            env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        got = kernels(env)
        if got != want:
            print(f"kernel matrix: {name}: FAILED to take effect: asked for ATen {want[0]} and oneDNN {want[1]}, "
                  f"got {got[0]} and {got[1]}")  # fmt: skip
            failed.append(name)
            continue
        print(f"kernel matrix: {name}: ATen {got[0]}, oneDNN {got[1]}" + (f", {threads} thread" if threads else ""))
        files = NUMERICS if threads else COMPUTING  # the machine policy's tests do not depend on threads
        command = [sys.executable, "-m", "pytest", *(f"tests/{f}" for f in files), *pytest_args]
        if subprocess.run(command, env=env, cwd=ROOT).returncode not in (0, 5):  # 5: -k selected none of them
            failed.append(name)
    if failed:
        print(f"kernel matrix: failed under: {'; '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
