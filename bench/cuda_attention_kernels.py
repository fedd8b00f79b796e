"""Which attention kernel trains the handout's model on a CUDA GPU (the check behind attention.CUDA_ATTENTION_KERNELS).

    python bench/cuda_attention_kernels.py math              # the fast path as it is now
    python bench/cuda_attention_kernels.py efficient --seed 1
    python bench/cuda_attention_kernels.py matmul --fp32     # other flags go to run.py pretrain

Runs the handout's vanilla pretraining (`run.py pretrain vanilla wiki.txt`, the
handout's preset: batch 128, lr 6e-3, bf16 autocast on the fast path) for
`--max_steps 4600` (200 of its 650 epochs, the schedule unchanged), with the
fast path's attention on CUDA forced to one kernel:

  cudnn | efficient | flash | math   scaled_dot_product_attention with only that kernel
  matmul                             the plain matmul-softmax of the CPU fast path

It prints run.py's per-epoch losses; compare them across kernels (and with
`--fp32`). On an H100 (PyTorch 2.11, 2026-11-25): cuDNN
NaN from epoch 1, memory-efficient stalled at 3.0-3.2, math 2.29 and matmul 2.44
at epoch 200 (bench/RESEARCH.md). Needs a CUDA GPU.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import attention  # noqa: E402
import run  # noqa: E402

KERNELS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "math": SDPBackend.MATH,
}


def matmul_attention(q, k, v, attn_mask=None, dropout_p=0.0):
    """scaled_dot_product_attention's interface over the plain matmul-softmax."""
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if attn_mask is not None:
        att = att.masked_fill(~attn_mask, float("-inf"))
    return F.dropout(F.softmax(att, dim=-1), dropout_p) @ v


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in [*KERNELS, "matmul"]:
        print(f"usage: cuda_attention_kernels.py {{{','.join([*KERNELS, 'matmul'])}}} [run.py flags]", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU", file=sys.stderr)
        return 1
    kernel, extra = argv[0], argv[1:]
    if kernel == "matmul":
        attention.F.scaled_dot_product_attention = matmul_attention
    else:
        attention.CUDA_ATTENTION_KERNELS[:] = [KERNELS[kernel]]
    params = str(ROOT / "bench" / "runs" / f"cuda_attention_{kernel}.params")
    return run.main(["pretrain", "vanilla", "wiki.txt", "--writing_params_path", params, "--max_steps", "4600", *extra])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
