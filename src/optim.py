"""Optimizers: the handout's AdamW, and Muon for the blocks' matrices, which stored facts faster per epoch on a CPU
(bench/RESEARCH.md). `make_optimizer` builds what the trainer steps."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def orthogonalize(matrix: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Roughly U Vᵀ for a 2-D matrix U S Vᵀ, in its dtype: a quintic Newton–Schulz iteration in `dtype` pushes every
    singular value into about 0.7–1.2."""
    # Jordan's coefficients (2024): the steepest slope at zero for which five steps still land near 1.
    a, b, c = 3.4445, -4.7750, 2.0315
    x = matrix.to(dtype)
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x  # iterate on the short side's Gram matrix, the cheaper one
    x = x / (x.norm() + 1e-7)  # now every singular value is <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(matrix.dtype)


def orthogonalize_spectral(matrix: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """`orthogonalize(matrix, steps)` in at least fp32 from one eigendecomposition (cheaper on a CPU without native
    bf16): a step maps a singular value s to s·(a + b·s² + c·s⁴), keeping the singular vectors, so with X Xᵀ =
    U diag(s²) Uᵀ the iteration is U diag(r) Uᵀ X, r the product of those factors."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = matrix.to(torch.promote_types(matrix.dtype, torch.float32))  # fp32, or float64 for float64
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    x = x / (x.norm() + 1e-7)
    # On one thread: LAPACK's eigensolver joins its threads often, and beside another busy process each join waits
    # for a time slice. Alone, one thread is about as fast.
    gram, threads = x @ x.T, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eigenvalues, eigenvectors = torch.linalg.eigh(gram)
    except torch.linalg.LinAlgError:  # no convergence (e.g. a non-finite gradient): the iteration decides
        return orthogonalize(matrix, steps)
    finally:
        torch.set_num_threads(threads)
    squared = eigenvalues.clamp_min(0)  # rounding can leave tiny negative eigenvalues
    ratio = torch.ones_like(squared)  # the iteration's output singular value over its input one
    for _ in range(steps):
        s2 = ratio * ratio * squared
        ratio = ratio * (a + b * s2 + c * s2 * s2)
    x = (eigenvectors * ratio) @ (eigenvectors.T @ x)
    return (x.T if tall else x).to(matrix.dtype)


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al., 2024) for 2-D weight matrices: Nesterov momentum with an orthogonalised update, so that
    every direction moves equally, rare ones included. The scale 0.2·sqrt(max(rows, cols)) gives the update the RMS
    of an AdamW step (Liu et al., 2025, "Muon is Scalable for LLM Training"), so AdamW's rate and weight decay carry
    over. It iterates in `ns_dtype` (torch.optim.Muon's bf16 is slow where emulated) or `spectral`.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        ns_dtype: torch.dtype = torch.float32,
        spectral: bool = False,
    ):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})
        self.ns_dtype, self.spectral = ns_dtype, spectral

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        """Update every parameter that has a gradient."""
        for group in self.param_groups:
            lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buffer = state["momentum_buffer"].mul_(momentum).add_(p.grad)
                update = p.grad.add(buffer, alpha=momentum)  # Nesterov
                direction = (
                    orthogonalize_spectral(update) if self.spectral else orthogonalize(update, dtype=self.ns_dtype)
                )
                p.mul_(1 - lr * decay)
                p.add_(direction, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))


class MuonAdamW:
    """Muon and AdamW, stepped and checkpointed as one optimizer."""

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def make_optimizer(
    model: torch.nn.Module,
    optimizer: str,
    decay: str,
    learning_rate: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
    precision: str = "fp32",
) -> torch.optim.AdamW | MuonAdamW:
    """The handout's AdamW ("adamw"), or Muon for the hidden nn.Linear weights and AdamW for the rest ("muon"; `head`
    stays with AdamW, as Muon's authors advise). `decay` "matmul" decays only nn.Linear weights: biases, LayerNorms,
    embedding tables and the perceiver's basis are looked up or added, not multiplied, so shrinking them is no
    useful prior; "all_but_biases" is the handout's rule. Frozen parameters are in neither.
    """
    linear = {f"{mn}.weight" if mn else "weight" for mn, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if decay == "matmul":
        decayed = linear
    elif decay == "all_but_biases":
        decayed = {n for n in params if not n.endswith("bias")}
    else:
        raise ValueError(f"unknown decay {decay!r}")
    if optimizer not in ("adamw", "muon"):
        raise ValueError(f"unknown optimizer {optimizer!r}")
    hidden = {n for n in linear if not n.startswith("head.")} if optimizer == "muon" else set()
    groups = [
        {"params": [p for n, p in params.items() if n in decayed - hidden], "weight_decay": weight_decay},
        {"params": [p for n, p in params.items() if n not in decayed], "weight_decay": 0.0},
    ]
    # The fused kernel does the same update several times faster than the default, which the handout uses.
    fused = all(p.device.type in ("cpu", "cuda") for p in params.values())
    adamw = torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused or None)
    matrices = [p for n, p in params.items() if n in hidden]
    if not matrices:  # "adamw", or every hidden matrix frozen
        return adamw
    # Muon iterates in bf16 where training does; in fp32 on a CPU, one eigendecomposition beats five rounds of matmuls.
    bf16 = precision == "bf16"
    spectral = not bf16 and matrices[0].device.type == "cpu"
    muon = Muon(
        matrices, learning_rate, weight_decay, ns_dtype=torch.bfloat16 if bf16 else torch.float32, spectral=spectral
    )
    return MuonAdamW(muon, adamw)
