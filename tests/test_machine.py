"""Specification of the machine policy's measured choices (src/machine.py): precision and micro-batches,
decided by timing this machine, cached per machine, said in one line, overridable by a flag."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from conftest import TINY_MODEL

import machine
import run
from machine import Measured
from params import read_sidecar

CPU = torch.device("cpu")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder and no verdict in this process yet; measure() counts its calls."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(machine, "_decided", {})
    calls = []

    def measure(device: torch.device) -> Measured:  # a CPU that only emulates bf16
        calls.append(device)
        return Measured(bf16_gflops=60.0, fp32_gflops=283.0, split_cost=1.05, date="2026-11-28")

    monkeypatch.setattr(machine, "measure", measure)
    return calls


def test_where_bf16_is_measured_slower_training_is_fp32_and_says_so(fresh_cache, capsys):
    chosen = machine.choose(CPU)
    assert chosen["precision"] == "fp32" and (chosen["bf16_gflops"], chosen["fp32_gflops"]) == (60.0, 283.0)
    said = capsys.readouterr().out
    assert said.startswith("precision: fp32 (bf16 is emulated here: bf16 60 against fp32 283 GFLOP/s a core")


def test_a_run_on_such_a_machine_trains_in_fp32_and_its_sidecar_records_the_rates(
    fresh_cache, tiny_corpus, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ["pretrain", "vanilla", str(tiny_corpus), "--writing_params_path", "p.params", *TINY_MODEL]
    assert run.main([*argv, "--max_steps", "1"]) == 0
    speed = read_sidecar("p.params")["speed"]
    assert speed == {"precision": "fp32", "bf16_gflops": 60.0, "fp32_gflops": 283.0, "micro_batch": 32}


def test_where_bf16_is_measured_faster_it_is_chosen_unless_fp32_is_asked_for(fresh_cache, monkeypatch):
    monkeypatch.setattr(machine, "measure", lambda device: Measured(396.0, 181.0, 1.05, "2026-11-28"))
    assert machine.choose(CPU, say=False)["precision"] == "bf16"
    assert machine.choose(CPU, fp32=True, say=False)["precision"] == "fp32"


def test_a_verdict_is_measured_once_and_read_from_the_cache_after(fresh_cache, monkeypatch, capsys):
    machine.choose(CPU)
    monkeypatch.setattr(machine, "_decided", {})  # a new process
    machine.choose(CPU)
    assert len(fresh_cache) == 1 and "cached 2026-11-28" in capsys.readouterr().out.splitlines()[-1]


def test_a_cache_written_for_another_cpu_or_torch_is_not_used(fresh_cache):
    other = {"bf16_gflops": 999.0, "fp32_gflops": 1.0, "split_cost": 1.0, "date": "2026-01-01"}
    path = machine.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cpu: another CPU, family 6 model 207, 2 cores, torch 2.13.0": other}))
    assert machine.choose(CPU, say=False)["precision"] == "fp32"  # measured here, not the other CPU's bf16
    assert len(fresh_cache) == 1 and len(json.loads(path.read_text())) == 2  # both machines' verdicts kept


def test_a_damaged_cache_is_measured_over(fresh_cache):
    machine.cache_path().parent.mkdir(parents=True)
    machine.cache_path().write_text("{not json")
    assert machine.choose(CPU, say=False)["precision"] == "fp32" and len(fresh_cache) == 1


@pytest.mark.parametrize(("split_cost", "rows"), [(1.0, 32), (1.4, 32), (1.6, 0), (4.0, 0)])
def test_micro_batches_are_used_where_the_same_work_in_parts_costs_little_more(split_cost, rows):
    assert Measured(300.0, 150.0, split_cost, "2026-11-28").micro_batch == rows


def test_a_flag_overrides_the_measured_micro_batches(fresh_cache):
    assert machine.choose(CPU, micro_batch=0, say=False)["micro_batch"] == 0


def test_the_probe_times_both_precisions_on_one_core_and_leaves_the_thread_count(monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setattr(machine, "PROBE_SECONDS", 0.0)  # its three rounds only
    found = machine.measure(CPU)
    assert found.bf16_gflops > 0 and found.fp32_gflops > 0 and found.split_cost > 0
    assert found.source == "measured" and torch.get_num_threads() == threads


def test_a_verdict_holds_for_the_kernels_it_was_measured_with(fresh_cache, monkeypatch):
    # The same CPU held to other kernels (oneDNN's or MKL's instruction set, ATen's capability) measures anew: each
    # setting changes to a value other than the one the suite runs under.
    machine.choose(CPU, say=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41" if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2" else "AVX2")
    monkeypatch.setattr(machine, "_decided", {})
    machine.choose(CPU, say=False)
    other = "DEFAULT" if torch.backends.cpu.get_cpu_capability() != "DEFAULT" else "AVX2"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
    monkeypatch.setattr(machine, "_decided", {})
    machine.choose(CPU, say=False)
    assert len(fresh_cache) == 3 and len(json.loads(machine.cache_path().read_text())) == 3


# The cache is data from outside: whatever a user's machine left in it is measured over, never trusted or followed.
GOOD = {"bf16_gflops": 60.0, "fp32_gflops": 283.0, "split_cost": 1.05, "date": "2026-11-28"}
DAMAGED = [("bf16_gflops", "fast"), ("bf16_gflops", None), ("split_cost", "cheap"), ("bf16_gflops", -1),
           ("fp32_gflops", -5), ("bf16_gflops", float("inf")), ("bf16_gflops", 1e308), ("bf16_gflops", True),
           ("fp32_gflops", False), ("split_cost", float("nan")), ("split_cost", 0), ("date", 20261128)]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), DAMAGED)
def test_a_damaged_cache_entry_is_measured_over_and_rewritten(fresh_cache, field, value):
    key = machine.machine_key(CPU)
    machine.cache_path().parent.mkdir(parents=True)
    machine.cache_path().write_text(json.dumps({key: {**GOOD, "bf16_gflops": 999.0, field: value}}))
    assert machine.choose(CPU, say=False)["precision"] == "fp32" and len(fresh_cache) == 1
    assert json.loads(machine.cache_path().read_text())[key] == GOOD  # the measurement replaced it


def test_a_cache_path_that_is_a_fifo_is_neither_read_nor_written(fresh_cache, capsys):
    machine.cache_path().parent.mkdir(parents=True)
    os.mkfifo(machine.cache_path())
    assert machine.choose(CPU, say=False)["precision"] == "fp32" and len(fresh_cache) == 1
    assert stat.S_ISFIFO(machine.cache_path().stat().st_mode)
    assert "is not a regular file" in capsys.readouterr().out


def test_a_cache_path_that_links_to_a_users_file_leaves_it_as_it_was(fresh_cache, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    machine.cache_path().parent.mkdir(parents=True)
    machine.cache_path().symlink_to(notes)
    machine.choose(CPU, say=False)
    assert notes.read_text() == "mine\n" and machine.cache_path().is_symlink()


@pytest.mark.parametrize("xdg", ["relative/cache", ""])
def test_a_relative_or_empty_xdg_cache_home_means_the_homes_cache(fresh_cache, tmp_path, monkeypatch, xdg):
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert machine.cache_path() == tmp_path / "home" / ".cache" / "birthplace-gpt" / "machine.json"


@pytest.mark.parametrize("home", [None, ""])
def test_without_a_home_the_run_measures_without_a_cache_and_says_so(fresh_cache, monkeypatch, capsys, home):
    monkeypatch.delenv("XDG_CACHE_HOME")
    if home is None:  # a uid without a passwd entry, HOME unset: expanduser gives "~" back
        monkeypatch.delenv("HOME", raising=False)
        monkeypatch.setattr(os.path, "expanduser", lambda path: path)
    else:
        monkeypatch.setenv("HOME", home)
    assert machine.cache_path() is None
    assert machine.choose(CPU, say=False)["precision"] == "fp32" and len(fresh_cache) == 1
    assert "not cached (no home folder holds it)" in capsys.readouterr().out
