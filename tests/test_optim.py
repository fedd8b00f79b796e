"""Specification of the optimizers: the weight-decay rules, Muon, and which parameters each takes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import rounding
from test_trainer import tiny_run

import optim
from bench import course
from model import GPT, GPTConfig
from optim import Muon, MuonAdamW, make_optimizer, orthogonalize, orthogonalize_spectral
from trainer import TrainerConfig


def config(**settings) -> TrainerConfig:
    """A TrainerConfig of the handout's rate and these settings (the loop's own settings do not matter here)."""
    return TrainerConfig(max_epochs=1, batch_size=8, learning_rate=6e-3, **settings)


def optimizer_of(model: torch.nn.Module, config: TrainerConfig):
    """The optimizer the Trainer makes for `model` with `config`."""
    c = config
    return make_optimizer(model, c.optimizer, c.decay, c.learning_rate, c.weight_decay, c.betas, c.precision)


def test_weight_decay_applies_to_linear_weights_only():
    model = GPT(
        GPTConfig(vocab_size=10, block_size=8, n_layer=3, n_head=2, n_embd=8, variant="perceiver", bottleneck_dim=4)
    )
    opt = optimizer_of(model, config())
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in opt.param_groups[0]["params"]}
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    assert "head.weight" in decayed and "blocks.0.attn.key.weight" in decayed and "blocks.0.mlp.0.weight" in decayed
    for n in ("tok_emb.weight", "pos_emb", "down_block.C", "ln_f.weight", "blocks.0.attn.key.bias"):
        assert n not in decayed
    assert len(decayed) + len(opt.param_groups[1]["params"]) == len(names)


def test_adamw_is_fused_and_steps_as_the_courses_default_adamw_does():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8)).double()  # see test_trainer
    theirs = course.course_copy(model).double()
    handout = config(decay="all_but_biases")  # the handout's decay rule
    ours_opt, their_opt = optimizer_of(model, handout), course.optimizer(theirs, handout)
    assert ours_opt.defaults["fused"] is True and not their_opt.defaults["fused"]
    their_params = dict(theirs.named_parameters())
    for _ in range(3):
        for name, p in model.named_parameters():
            p.grad = torch.randn_like(p)
            their_params[name].grad = p.grad.clone()
        ours_opt.step()
        their_opt.step()
    # The same gradients through the same update in another order of operations: in float64 (eps 2.2e-16) three steps
    # of about ten roundings each move parameters of size about one by under 1e-14; times 100 for safety.
    tolerance = 3 * 10 * torch.finfo(torch.float64).eps * 100
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, their_params[name], atol=tolerance, rtol=tolerance, msg=name)


@pytest.mark.parametrize("shape", [(24, 24), (16, 48), (48, 16)])
def test_orthogonalize_keeps_the_singular_vectors_and_pushes_the_singular_values_towards_one(shape):
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape)))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape)))
    spread = torch.logspace(-1, 1, min(shape))  # singular values from 0.1 to 10
    out = orthogonalize(u @ torch.diag(spread) @ v.T)
    assert out.shape == shape
    inner = u.T @ out @ v  # diagonal when out has the same singular vectors
    # fp32 rounding only: five steps of sums over 48 + 24 + 24 terms at most, then inner's two products over 48, of
    # values no larger than out's singular values (below 1.25).
    assert (inner - torch.diag(inner.diagonal())).abs().max() < rounding(5 * (48 + 24 + 24) + 2 * 48) * 1.25
    assert inner.diagonal().min() > 0.6 and inner.diagonal().max() < 1.25


@pytest.mark.parametrize("shape", [(48, 48), (24, 96), (96, 24)])
@pytest.mark.parametrize("smallest", [1e-1, 1e-4, 1e-6])
def test_orthogonalize_spectral_equals_the_newton_schulz_iteration(shape, smallest):
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape)))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape)))
    matrix = (u @ torch.diag(torch.logspace(0, math.log10(smallest), min(shape))) @ v.T).double()
    iterated, spectral = orthogonalize(matrix, dtype=torch.float64), orthogonalize_spectral(matrix)
    assert spectral.shape == shape and spectral.dtype == matrix.dtype
    # In float64 the two are the same polynomial of X Xᵀ: an eigenvector's error (rounding over the gap to
    # its neighbours, which the tiny singular values make small) meets a ratio that differs across that gap
    # by as little, so the results agree to float64's rounding times the matrix's size, far below 1e-9.
    assert (spectral - iterated).norm() / iterated.norm() < 1e-9


def test_orthogonalize_spectral_falls_back_to_the_iteration_when_the_eigensolver_fails(monkeypatch):
    def fail(matrix):
        raise torch.linalg.LinAlgError("did not converge")

    matrix = torch.randn(8, 12)
    monkeypatch.setattr(torch.linalg, "eigh", fail)
    assert torch.equal(orthogonalize_spectral(matrix), orthogonalize(matrix))  # bitwise by design: the same call


def test_muon_is_spectral_on_the_cpu_in_fp32_and_iterates_in_bf16_where_training_is_bf16():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8))
    assert optimizer_of(model, config(optimizer="muon", precision="fp32")).muon.spectral
    muon = optimizer_of(model, config(optimizer="muon", precision="bf16")).muon
    assert not muon.spectral and muon.ns_dtype == torch.bfloat16


def counted(function, calls: list):
    """`function`, appending to `calls` at every call."""

    def counting(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)

    return counting


def test_spectral_muon_training_follows_the_iterated_muon_loss_curve(monkeypatch):
    eigendecompositions, iterations = [], []
    monkeypatch.setattr(optim, "orthogonalize_spectral", counted(orthogonalize_spectral, eigendecompositions))
    spectral = tiny_run(steps=8, dropout=0.0, optimizer="muon")
    monkeypatch.setattr(optim, "orthogonalize_spectral", counted(orthogonalize, iterations))  # the fp32 iteration
    iterated = tiny_run(steps=8, dropout=0.0, optimizer="muon")
    assert len(eigendecompositions) == len(iterations) > 0  # each run orthogonalised every update its own way
    # The two agree to the iteration's fp32 rounding: five steps of sums over at most 64 terms (the MLP's width), a
    # relative 5 * 64 * eps of each update, which moves the loss by less than its own size; times 10 for safety.
    np.testing.assert_allclose(spectral, iterated, rtol=10 * rounding(5 * 64))


@pytest.mark.parametrize("shape", [(32, 32), (16, 64), (64, 16)])
def test_a_muon_step_has_the_rms_of_a_typical_adamw_step_whatever_the_shape(shape):
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(shape))
    weight.grad = torch.randn(shape)
    before = weight.detach().clone()
    Muon([weight], lr=1e-3).step()
    rms = (weight.detach() - before).pow(2).mean().sqrt().item()
    assert 0.15e-3 < rms < 0.25e-3  # AdamW's steps have an RMS of about 0.2 * lr


def test_muon_decays_its_weights_like_adamw():
    weight = torch.nn.Parameter(torch.ones(4, 4))
    weight.grad = torch.zeros(4, 4)  # no gradient: only the decay moves the weights
    Muon([weight], lr=0.1, weight_decay=0.5).step()
    assert torch.allclose(weight.detach(), torch.full((4, 4), 0.95))


def test_muon_optimizer_gives_the_hidden_matrices_to_muon_and_the_rest_to_adamw():
    model = GPT(
        GPTConfig(vocab_size=10, block_size=8, n_layer=3, n_head=2, n_embd=8, variant="perceiver", bottleneck_dim=4)
    )
    opt = optimizer_of(model, config(optimizer="muon"))
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for group in opt.muon.param_groups for p in group["params"]}
    adamw = {names[id(p)] for group in opt.adamw.param_groups for p in group["params"]}
    assert "blocks.0.attn.key.weight" in muon and "blocks.0.mlp.0.weight" in muon
    assert "down_block.attn.query.weight" in muon and "up_block.mlp.2.weight" in muon
    for n in ("head.weight", "tok_emb.weight", "pos_emb", "down_block.C", "ln_f.weight", "blocks.0.attn.key.bias"):
        assert n in adamw
    assert not muon & adamw and len(muon) + len(adamw) == len(names)
    assert all(group["weight_decay"] == 0.1 for group in opt.muon.param_groups)
    assert {names[id(p)] for p in opt.adamw.param_groups[0]["params"]} == {"head.weight"}  # the decayed group


def test_handout_decay_shrinks_every_parameter_but_the_biases():
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16))
    optimizer = optimizer_of(model, config(decay="all_but_biases"))
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names == {n for n, _ in model.named_parameters() if not n.endswith("bias")}
    assert {"tok_emb.weight", "pos_emb", "ln_f.weight"} <= names


def test_default_decay_shrinks_only_matmul_weights():
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16))
    optimizer = optimizer_of(model, config())
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names and all(n.endswith(".weight") and ".ln" not in n and "emb" not in n for n in names)


def test_the_eigensolver_runs_on_one_thread_and_leaves_the_thread_count(monkeypatch, restore_threads):
    # Beside another busy process, a multi-threaded eigensolver waits at every join (bench/RESEARCH.md).
    seen, eigh = [], torch.linalg.eigh

    def spy(matrix: torch.Tensor):
        seen.append(torch.get_num_threads())
        return eigh(matrix)

    torch.set_num_threads(2)
    monkeypatch.setattr(torch.linalg, "eigh", spy)
    orthogonalize_spectral(torch.randn(16, 48))
    assert seen == [1] and torch.get_num_threads() == 2
