"""Specification of the scaling benchmark (bench/bench_scaling.py: a training step's time, memory and FLOPs
against the length T, per variant) and of its figure (bench/plot_scaling.py)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from bench import bench_scaling, plot_scaling
from bench.bench_scaling import Point
from bench.research import VARIANTS

RECORDED = REPO_ROOT / "bench" / "results" / "scaling.jsonl"
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "bottleneck_dim": 8}


def handout_point(variant: str, T: int) -> Point:
    """The benchmark's point at length T: the handout's model, 16384 tokens."""
    return Point(variant, T, bench_scaling.TOKENS // T)


# ---------------------------------------------------------------------------
# The recorded rows


def test_every_recorded_row_has_its_fields_and_a_full_run_steps_on_16384_tokens():
    if not RECORDED.is_file():
        pytest.skip(f"{RECORDED} not recorded yet (python bench/bench_scaling.py)")
    rows = plot_scaling.read_rows(RECORDED)
    assert rows
    for r in rows:
        assert r["variant"] in VARIANTS and r["precision"] in ("bf16", "fp32")
        assert r["T"] > 0 and r["batch"] > 0 and r["run"] and r["date"] and r["load_average"] >= 0
        assert {"label", "device", "threads", "torch", *bench_scaling.CPU_FLAGS} <= set(r["machine"])
        if not r["quick"]:
            assert r["batch"] * r["T"] == bench_scaling.TOKENS
        if "skipped" in r:
            assert r["skipped"]
            continue
        assert r["seconds"] > 0 and r["flops"] > 0 and r["peak_gflops"] > 0 and r["step_peak_bytes"] >= 0
        assert r["predicted_seconds"] == pytest.approx(r["flops"] / r["peak_gflops"] / 1e9)


# ---------------------------------------------------------------------------
# FLOPs: the arithmetic, before any timing


def test_vanillas_flops_per_sequence_grow_faster_than_linearly_in_T_and_the_perceivers_linearly():
    def slope(variant: str, T: int) -> float:
        """FLOPs per sequence that each position added from T to 2T costs (B·T fixed, so B halves)."""
        longer, shorter = handout_point(variant, 2 * T), handout_point(variant, T)
        per_sequence = [bench_scaling.counted_flops(p) / p.batch for p in (longer, shorter)]
        return (per_sequence[0] - per_sequence[1]) / T

    for variant in ("vanilla", "rope"):
        assert slope(variant, 1024) > 1.25 * slope(variant, 512)  # the T×T attention: a position costs O(T)
    assert slope("perceiver", 1024) == pytest.approx(slope("perceiver", 512), rel=1e-9)  # past m: O(m) each


# ---------------------------------------------------------------------------
# Memory and time: what is skipped, and why


def test_a_point_that_would_not_fit_in_memory_is_skipped_with_what_it_needs():
    available = 16e9
    why = bench_scaling.skip_reason(handout_point("vanilla", 16384), None, 15.0, available)
    assert why is not None and why.startswith("needs about") and "16.0 GB" in why
    assert bench_scaling.skip_reason(handout_point("perceiver", 16384), None, 15.0, available) is None


def test_at_fixed_tokens_the_memory_estimate_grows_with_T_for_vanilla_and_stays_flat_for_the_perceiver():
    growth = {v: bench_scaling.memory_estimate(handout_point(v, 4096)) / bench_scaling.memory_estimate(
              handout_point(v, 1024)) for v in ("vanilla", "perceiver")}  # fmt: skip
    assert growth["vanilla"] > 2.5 and growth["perceiver"] < 1.2  # B·T² attention probabilities: 16384·T


def test_the_next_length_is_skipped_once_a_step_took_longer_than_the_limit_or_was_skipped():
    p = handout_point("vanilla", 4096)
    slow = {"T": 2048, "seconds": 20.0}
    assert "took 20.0 s" in bench_scaling.skip_reason(p, slow, 15.0, 1e12)
    assert bench_scaling.skip_reason(p, {**slow, "seconds": 10.0}, 15.0, 1e12) is None
    assert bench_scaling.skip_reason(p, {"T": 2048, "skipped": "needs about 99 GB"}, 15.0, 1e12) == (
        "T=2048 was skipped"
    )


def test_a_point_whose_process_was_killed_is_recorded_as_skipped_with_the_reason():
    killed = bench_scaling.child_result(subprocess.CompletedProcess([], -9, "", ""), 42.0)
    assert killed == {"skipped": "its process was killed by signal 9 (SIGKILL: out of memory, most likely) after 42 s"}
    failed = bench_scaling.child_result(subprocess.CompletedProcess([], 1, "", "Traceback\nMemoryError: x\n"), 1.0)
    assert failed["skipped"].endswith("MemoryError: x")


def test_a_long_step_is_warmed_up_once_and_timed_the_minimum_number_of_times(monkeypatch):
    clock = {"now": 0.0, "calls": 0}

    def step(seconds: float):
        def run() -> None:
            clock["now"] += seconds
            clock["calls"] += 1

        return run

    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])
    assert bench_scaling.timed_steps(step(0.1), warmup=2, steps=5, budget=60.0) == [pytest.approx(0.1)] * 5
    assert clock["calls"] == 7
    clock["calls"] = 0
    assert bench_scaling.timed_steps(step(30.0), 2, 5, 60.0) == [pytest.approx(30.0)] * bench_scaling.MIN_TIMED
    assert clock["calls"] == 1 + bench_scaling.MIN_TIMED


# ---------------------------------------------------------------------------
# Running points


def test_a_point_run_in_process_gives_positive_seconds_flops_and_its_memory():
    p = Point("rope", 16, 4, warmup=1, steps=2, **TINY)
    row = bench_scaling.run_point(p)
    assert len(row["step_seconds"]) == 2 and row["seconds"] > 0
    assert row["flops"] > 0
    assert row["baseline_rss_bytes"] > 0 and row["step_peak_bytes"] >= 0  # in process: the peak is the process's


def test_a_quick_run_records_each_point_measured_in_its_own_process(tmp_path, capsys):
    out = tmp_path / "scaling.jsonl"
    argv = ["--quick", "--variants", "perceiver", "--lengths", "32", "--peak_n", "256", "--out", str(out)]
    assert bench_scaling.main(argv) == 0
    (row,) = plot_scaling.read_rows(out)
    assert (row["variant"], row["T"], row["batch"], row["quick"]) == ("perceiver", 32, 16, True)
    assert row["seconds"] > 0 and row["flops"] > 0 and row["peak_rss_bytes"] > row["baseline_rss_bytes"] > 0
    assert row["achieved_gflops"] == pytest.approx(row["flops"] / row["seconds"] / 1e9)
    assert "| perceiver | 32 | 16 |" in capsys.readouterr().out


def test_no_record_prints_the_table_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_scaling, "run_point_in_child", lambda p, timeout: bench_scaling.run_point(p))
    monkeypatch.setattr(bench_scaling.research, "matmul_gflops", lambda *a, **k: 100.0)
    out = tmp_path / "scaling.jsonl"
    argv = ["--quick", "--no_record", "--variants", "perceiver", "--lengths", "16", "32", "--n_embd", "32"]
    assert bench_scaling.main([*argv, "--out", str(out)]) == 0
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "| perceiver | 16 | 32 |" in printed and "| perceiver | 32 | 16 |" in printed


# ---------------------------------------------------------------------------
# The figure


def scaling_row(run: str, variant: str, T: int, *, machine: str = "AMD EPYC, AVX-512 with bf16, 2 threads",
                precision: str = "bf16", quick: bool = False, skipped: str | None = None) -> dict:  # fmt: skip
    """A row as bench_scaling.py records it (only the fields the figure reads, and a few more)."""
    row = {"bench": "scaling", "run": run, "date": run[:10], "machine": {"label": machine}, "precision": precision,
           "quick": quick, "tokens": 16384, "variant": variant, "T": T, "batch": 16384 // T, "peak_gflops": 400.0}  # fmt: skip
    if skipped:
        return {**row, "skipped": skipped}
    return {**row, "seconds": T / 100, "flops": T * 1e9, "step_peak_bytes": T * 1e6}


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n", encoding="utf-8")
    return path


def test_the_figure_reads_the_newest_run_sorted_by_T_and_leaves_skipped_points_out(tmp_path):
    old, new = "2026-11-27T10:00:00", "2026-11-28T10:00:00"
    rows = [scaling_row(old, "vanilla", 128), scaling_row(new, "vanilla", 256), scaling_row(new, "vanilla", 128),
            scaling_row(new, "vanilla", 512, skipped="needs about 30 GB"), scaling_row(new, "perceiver", 128),
            {"bench": "epoch", "variant": "vanilla"}]  # fmt: skip
    run = plot_scaling.select_run(plot_scaling.read_rows(write_rows(tmp_path / "scaling.jsonl", rows)))
    assert (run.date, run.precision, run.tokens) == ("2026-11-28", "bf16", 16384)
    assert set(run.series) == {"vanilla", "perceiver"}
    vanilla = run.series["vanilla"]
    assert vanilla.T == [128, 256] and vanilla.seconds == [1.28, 2.56] and vanilla.memory == [128e6, 256e6]
    assert vanilla.predicted == [pytest.approx(128e9 / 400e9), pytest.approx(256e9 / 400e9)]
    assert vanilla.skipped == [(512, "needs about 30 GB")]


def test_the_figure_takes_a_machine_and_precision_filter_and_leaves_quick_runs_out(tmp_path):
    gpu, quick = "2026-11-28T09:00:00", "2026-11-28T11:00:00"
    rows = [scaling_row("2026-11-28T08:00:00", "vanilla", 128), scaling_row(gpu, "vanilla", 128, machine="NVIDIA H200"),
            scaling_row(gpu, "vanilla", 128, machine="NVIDIA H200", precision="fp32"),
            scaling_row(quick, "vanilla", 32, quick=True)]  # fmt: skip
    assert plot_scaling.select_run(rows).machine == "NVIDIA H200"
    assert plot_scaling.select_run(rows, machine="epyc").machine.startswith("AMD EPYC")
    assert plot_scaling.select_run(rows, machine="H200", precision="fp32").precision == "fp32"
    assert plot_scaling.select_run(rows, quick=True).series["vanilla"].T == [32]
    assert plot_scaling.select_run(rows, machine="Xeon") is None


def test_the_figure_is_written_as_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    run = "2026-11-28T10:00:00"
    rows = [scaling_row(run, v, T) for v in VARIANTS for T in (128, 256, 512)]
    rows.append(scaling_row(run, "vanilla", 1024, skipped="needs about 30 GB"))
    write_rows(tmp_path / "scaling.jsonl", rows)
    out = tmp_path / "scaling.png"
    assert plot_scaling.main(["--rows", str(tmp_path / "scaling.jsonl"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
