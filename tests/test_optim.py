"""Specification of the optimizers: the weight-decay rules, Muon, and which parameters each takes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_trainer import tiny_run

import optim
from bench import course
from model import GPT, GPTConfig
from optim import Muon, MuonAdamW, make_optimizer, orthogonalize, orthogonalize_spectral
from trainer import TrainerConfig


def config(**settings) -> TrainerConfig:
    """A TrainerConfig of the handout's rate and these settings (the loop's own settings do not matter here)."""
    return TrainerConfig(max_epochs=1, batch_size=8, learning_rate=6e-3, **settings)


def test_weight_decay_applies_to_linear_weights_only():
    model = GPT(
        GPTConfig(vocab_size=10, block_size=8, n_layer=3, n_head=2, n_embd=8, variant="perceiver", bottleneck_dim=4)
    )
    opt = make_optimizer(model, config())
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
    ours_opt, their_opt = make_optimizer(model, handout), course.optimizer(theirs, handout)
    assert ours_opt.defaults["fused"] is True and not their_opt.defaults["fused"]
    their_params = dict(theirs.named_parameters())
    for _ in range(3):
        for name, p in model.named_parameters():
            p.grad = torch.randn_like(p)
            their_params[name].grad = p.grad.clone()
        ours_opt.step()
        their_opt.step()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, their_params[name], atol=1e-12, rtol=1e-12, msg=name)


@pytest.mark.parametrize("shape", [(24, 24), (16, 48), (48, 16)])
def test_orthogonalize_keeps_the_singular_vectors_and_pushes_the_singular_values_towards_one(shape):
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape)))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape)))
    spread = torch.logspace(-1, 1, min(shape))  # singular values from 0.1 to 10
    out = orthogonalize(u @ torch.diag(spread) @ v.T)
    assert out.shape == shape
    inner = u.T @ out @ v  # diagonal when out has the same singular vectors
    assert (inner - torch.diag(inner.diagonal())).abs().max() < 1e-4
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
    assert torch.equal(orthogonalize_spectral(matrix), orthogonalize(matrix))


def test_muon_is_spectral_on_the_cpu_in_fp32_and_iterates_in_bf16_where_training_is_bf16():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8))
    assert make_optimizer(model, config(optimizer="muon", bf16=False)).muon.spectral
    muon = make_optimizer(model, config(optimizer="muon", bf16=True)).muon
    assert not muon.spectral and muon.ns_dtype == torch.bfloat16


def test_spectral_muon_training_follows_the_iterated_muon_loss_curve(monkeypatch):
    spectral = tiny_run(steps=8, dropout=0.0, optimizer="muon")
    monkeypatch.setattr(optim, "orthogonalize_spectral", orthogonalize)  # the fp32 iteration instead
    iterated = tiny_run(steps=8, dropout=0.0, optimizer="muon")
    assert spectral != iterated  # the patch took effect
    np.testing.assert_allclose(spectral, iterated, rtol=1e-3)


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
    opt = make_optimizer(model, config(optimizer="muon"))
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
    optimizer = make_optimizer(model, config(decay="all_but_biases"))
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names == {n for n, _ in model.named_parameters() if not n.endswith("bias")}
    assert {"tok_emb.weight", "pos_emb", "ln_f.weight"} <= names


def test_default_decay_shrinks_only_matmul_weights():
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16))
    optimizer = make_optimizer(model, config())
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names and all(n.endswith(".weight") and ".ln" not in n and "emb" not in n for n in names)
