"""Specification of the generated tables: the README's numbers come from bench/results, never by hand."""

from __future__ import annotations

import json

import pytest
from conftest import REPO_ROOT

from bench import tables


def logged(monkeypatch, tmp_path, **lines: dict) -> None:
    """Point the tables at a results folder holding one line in each named log (runs=... -> runs.jsonl)."""
    results = tmp_path / "results"
    results.mkdir()
    for name, line in lines.items():
        (results / f"{name}.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    monkeypatch.setattr(tables, "RESULTS", results)


def test_the_committed_readme_and_run_tables_are_what_the_logs_give():
    assert tables.main(["--check"]) == 0, "run: python bench/tables.py"


def test_a_new_logged_run_changes_the_results_table(monkeypatch, tmp_path):
    row = {"run": "rope", "recipe": "cpu", "machine": "a test machine", "date": "2026-01-01", "seed": 3,
           "dev_accuracy": 0.5, "minutes": 30.0, "command": "bash run.sh"}  # fmt: skip
    logged(monkeypatch, tmp_path, runs=row)
    assert "| rope | direct | cpu | a test machine | 3 | 50.0 | **50.0** | - | 30 |" in tables.results_table()


def test_a_baseline_shows_only_its_latest_machine(monkeypatch, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    runs = [{"run": "london", "recipe": "handout", "machine": machine, "date": "2026-01-01", "seed": 0,
             "dev_accuracy": 0.05, "minutes": 0.0, "command": "bash run.sh"} for machine in ("old machine", "new machine")]  # fmt: skip
    (results / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs), encoding="utf-8")
    monkeypatch.setattr(tables, "RESULTS", results)
    table = tables.results_table()
    assert "| London baseline | direct | handout | new machine |" in table and "old machine" not in table


def a_research_run(budget_fit: bool) -> dict:
    """A time_to_accuracy line of the cpu recipe: rope, seed 1, 97 epochs, 35.0% dev."""
    return {"name": "rope_seed1", "variant": "rope", "preset": "cpu", "seed": 1, "cpu": "a test machine",
            "started": "2026-01-01 10:00", "pretrain_doc_offset": 0, "pretrain_epochs_done": 97.0,
            "pretrain_config": {"optimizer": "muon", "batch_size": 32, "learning_rate": 1e-3, "max_epochs": 97,
                                "budget_fit": budget_fit},
            "finetune_config": {"learning_rate": 1e-4, "max_epochs": 5}, "dev_accuracy": 0.35,
            "total_seconds": 2400.0}  # fmt: skip


PIPELINE_RUN = {"run": "rope", "recipe": "cpu", "machine": "a test machine", "date": "2026-01-01", "seed": 0,
                "dev_accuracy": 0.25, "minutes": 30.0, "command": "bash run.sh", "pretrain_epochs": 87.0,
                "pretrain_doc_offset": 0}  # fmt: skip


def test_runs_of_one_recipe_on_one_machine_share_a_row_with_their_epochs_per_seed(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, runs=PIPELINE_RUN, time_to_accuracy=a_research_run(budget_fit=True))
    row = "| rope | direct | cpu, 87/97 epochs in a budget | a test machine | 0, 1 | 25.0, 35.0 | **30.0** | - | 35 |"
    assert row in tables.results_table()


def test_a_run_of_fixed_epochs_does_not_share_a_row_with_runs_planned_to_a_time_budget(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, runs=PIPELINE_RUN, time_to_accuracy=a_research_run(budget_fit=False))
    table = tables.results_table()
    assert "| rope | direct | cpu, 87 epochs in a budget | a test machine | 0 | 25.0 | **25.0** | - | 30 |" in table
    assert "| rope | direct | cpu, 97 epochs | a test machine | 1 | 35.0 | **35.0** | - | 40 |" in table


def test_a_research_run_of_the_cpu_recipe_on_a_gpu_is_labelled_with_the_gpu_not_its_host(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, time_to_accuracy={**a_research_run(budget_fit=False), "gpu": "a test GPU"})
    table = tables.results_table()
    assert "| rope | direct | cpu, 97 epochs | a test GPU | 1 |" in table and "a test machine" not in table


def test_a_logged_ensemble_is_listed_with_every_run_with_its_whole_cost(monkeypatch, tmp_path):
    line = {"label": "ensemble of rope seeds 0, 1", "variants": ["rope"], "members": 2, "machine": "a test machine",
            "date": "2026-01-01", "dev_accuracy": 0.358, "minutes": 65.3}  # fmt: skip
    logged(monkeypatch, tmp_path, ensembles=line)
    assert "| ensemble of rope seeds 0, 1 | rope | a test machine | fp32 | - | cpu | - | 35.8% | 65.3 |" in (
        tables.all_runs_table()
    )


RECITED = {"name": "vanilla_seed0", "variant": "vanilla", "seed": 0, "protocol": "recite", "machine": "a test machine",
           "preset": "cpu", "finetune_flags": [], "pretrain_preset": "cpu", "pretrain_seconds": 1500.0,
           "pretrain_epochs": 95.0, "reader_seconds": 120.0, "recite_dev_seconds": 60.0, "recite_chars": 100,
           "reader_config": {"learning_rate": 6e-4, "max_epochs": 10, "dropout": 0.1, "batch_size": 256},
           "dev_accuracy": 0.6, "place_in_recitation_dev": 0.75, "extra_minutes": 3.0, "pretrain_doc_offset": 0,
           "reader_examples": 1600, "reader_copies": True}  # fmt: skip


def test_a_recite_run_is_a_row_after_the_direct_ones_with_its_ceiling_and_extra_minutes(monkeypatch, tmp_path):
    direct = {"run": "vanilla", "recipe": "cpu", "machine": "a test machine", "date": "2026-01-01", "seed": 0,
              "dev_accuracy": 0.25, "minutes": 30.0, "command": "bash run.sh", "protocol": "direct"}  # fmt: skip
    logged(monkeypatch, tmp_path, runs=direct, recite=RECITED)
    table = tables.results_table()
    recited = "| vanilla | recite | cpu, 95 epochs | a test machine | 0 | 60.0 | **60.0** | 75.0% | 28 (+3.0 recite) |"
    assert recited in table
    assert table.index("| vanilla | direct |") < table.index(recited)


@pytest.mark.parametrize(
    "reader",
    [
        {"max_epochs": 5, "learning_rate": 1e-4, "dropout": 0.0},  # an earlier finetune
        {"max_epochs": 10, "learning_rate": 6e-4, "dropout": 0.1},  # today's, on all recitations (no count)
    ],
)
def test_a_run_sh_recite_row_of_an_earlier_reader_recipe_stays_out_of_the_results_table(monkeypatch, tmp_path, reader):
    line = {"run": "vanilla", "recipe": "cpu", "machine": "a test machine", "date": "2026-01-01", "seed": 0,
            "dev_accuracy": 0.6, "minutes": 30.0, "command": "bash run.sh", "protocol": "recite",
            "reader": reader, "place_in_recitation": 0.7, "extra_minutes": 2.0}  # fmt: skip
    logged(monkeypatch, tmp_path, runs=line)
    assert "| recite |" not in tables.results_table()
    assert "| run.sh 2026-01-01: vanilla (recite) |" in tables.all_runs_table()


def test_a_recite_run_on_a_short_pretraining_stays_out_of_the_results_table(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, recite={**RECITED, "pretrain_epochs": 38.0})
    assert "| recite |" not in tables.results_table()


def test_a_recite_run_with_other_flags_than_the_readers_settings_stays_out_of_the_results_table(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, recite={**RECITED, "finetune_flags": ["--recite_chars", "60"]})
    assert "| recite |" not in tables.results_table()


def test_a_cpu_run_is_labelled_with_the_settings_in_which_it_differs_from_todays_preset():
    today = tables.CPU_PRETRAIN["doc_offset"]
    assert tables.cpu_recipe(today, None) == tables.cpu_recipe(None, None) == "cpu"
    assert tables.cpu_recipe(today + 7, None) == f"cpu, offset {today + 7}"
    gentle = {"max_epochs": 5, "learning_rate": 1e-4, "dropout": 0.0, "examples": 1600, "copies": True}
    assert tables.cpu_recipe(None, gentle) == "cpu, reader 5 epochs at 1e-4"
    today = {"max_epochs": 10, "learning_rate": 6e-4, "dropout": 0.1, "examples": 1600, "copies": True}
    assert tables.cpu_recipe(None, today) == "cpu"


def test_a_reader_that_trained_on_every_recitation_is_labelled_so():
    reader = {"max_epochs": 10, "learning_rate": 6e-4, "dropout": 0.1, "copies": True}  # no count of examples
    assert tables.cpu_recipe(None, reader) == "cpu, reader on all recitations"
    assert tables.cpu_recipe(None, {**reader, "max_epochs": 5}) == "cpu, reader 5 epochs at 6e-4 on all recitations"


def test_a_reader_whose_answers_were_not_spans_of_its_recitations_is_labelled_so():
    reader = {"max_epochs": 10, "learning_rate": 6e-4, "dropout": 0.1, "examples": 1600}  # logged before copying
    assert tables.cpu_recipe(None, reader) == "cpu, reader decoding freely"


GPU_RUN = {"name": "rope_cuda_handout_seed0", "protocol": "direct", "variant": "rope", "seed": 0, "gpu": "A GPU",
           "runs_sharing_device": 4, "pretrain_epochs": 650, "order": "file", "pretrain_seconds": 420.0,
           "finetune_seconds": 12.0, "evaluate_seconds": 6.0, "dev_accuracy": 0.35}  # fmt: skip


def test_a_gpu_recite_run_is_a_recite_row_with_its_ceiling(monkeypatch, tmp_path):
    recited = {**GPU_RUN, "name": "rope_cuda_handout_seed0_recite", "protocol": "recite", "dev_accuracy": 0.7,
               "place_in_recitation": 0.8, "extra_minutes": 1.0}  # fmt: skip
    logged(monkeypatch, tmp_path, gpu=recited)
    assert "| rope | recite | handout, 650 epochs | A GPU (4 runs sharing it) | 0 | 70.0 | **70.0** | 80.0% |" in (
        tables.results_table()
    )


def test_a_gpu_run_measured_elsewhere_is_listed_with_who_ran_it(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, gpu={**GPU_RUN, "measured_elsewhere": True, "ran_by": "a test run at 0abc123"})
    assert "| rope_cuda_handout_seed0 (measured elsewhere: a test run at 0abc123) | rope | A GPU |" in (
        tables.all_runs_table()
    )


def test_a_gpu_run_step_made_on_a_cpu_is_marked_in_the_listing(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, gpu={**GPU_RUN, "cpu_steps": ["evaluate"]})
    assert "| handout, file order, decay all_but_biases, dev evaluated on a CPU | 650 | 35.0% |" in (
        tables.all_runs_table()
    )


def test_a_recite_row_averages_the_recite_minutes_of_the_seeds_whose_reader_was_timed(monkeypatch, tmp_path):
    recited = {**GPU_RUN, "protocol": "recite", "dev_accuracy": 0.7, "place_in_recitation": 0.8}
    lines = [{**recited, "extra_minutes": 1.0}, {**recited, "seed": 1, "extra_minutes": None}]
    logged(monkeypatch, tmp_path)
    (tmp_path / "results" / "gpu.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert "| 0, 1 | 70.0, 70.0 | **70.0** | 80.0% | 7 (+1.0 recite, 1 of 2 seeds) |" in tables.results_table()


def test_a_gpu_speed_line_shows_milliseconds_and_the_fast_path_in_fp32(monkeypatch, tmp_path):
    step = {"variant": "vanilla", "batch_size": 128}
    line = {"machine": "NVIDIA A GPU, torch 2.11.0+cu130", "train": [
        {**step, "impl": "reference", "seconds_per_step": 0.020}, {**step, "impl": "fast", "seconds_per_step": 0.025}],
        "train_fast_fp32": [{**step, "impl": "fast", "bf16": False, "seconds_per_step": 0.016}]}  # fmt: skip
    logged(monkeypatch, tmp_path, speed=line)
    table = tables.speed_table()
    assert (
        "| A GPU | pretraining step, vanilla, batch 128 | 20 ms | 25 ms; 16 ms in fp32 (`--fp32`) | 0.8x; 1.2x |"
        in table
    )


def test_a_gpu_speed_line_shows_the_compiled_step_with_its_mfu(monkeypatch, tmp_path):
    step = {"variant": "rope", "batch_size": 128}
    line = {"machine": "NVIDIA A GPU, torch 2.11.0+cu130", "train": [
        {**step, "impl": "reference", "seconds_per_step": 0.020, "handout_mfu": 0.02},
        {**step, "impl": "fast", "seconds_per_step": 0.025, "handout_mfu": 0.016}],
        "train_fast_compiled": [{**step, "impl": "fast", "compiled": True, "seconds_per_step": 0.004,
                                 "handout_mfu": 0.1}]}  # fmt: skip
    logged(monkeypatch, tmp_path, speed=line)
    assert (
        "| A GPU | pretraining step, rope, batch 128 | 20 ms (MFU 2%) | 25 ms (MFU 2%); 4 ms (MFU 10%) compiled "
        "(`--compile`) | 0.8x; 5.0x |" in tables.speed_table()
    )


@pytest.mark.parametrize(("date", "shown"), [("2026-11-25 02:51", False), (tables.ONE_DECODER, True)])
def test_decoding_timed_before_the_one_decoder_is_not_shown(monkeypatch, tmp_path, date, shown):
    decoding = {"variant": "vanilla", "params": "run/vanilla.finetune.params", "reference_seconds": 100.0,
                "fast_seconds": 2.0, "identical_predictions": True, "speedup": 50.0}  # fmt: skip
    logged(monkeypatch, tmp_path, speed={"machine": "a CPU, 2 threads, torch 2.13", "date": date, "eval": [decoding]})
    assert ("decoding 500 dev questions" in tables.speed_table()) == shown


def test_the_readme_stays_a_short_users_guide():
    assert len((REPO_ROOT / "README.md").read_bytes()) <= 15_000
    assert len((REPO_ROOT / "bench" / "RESEARCH.md").read_bytes()) <= 40_000


def test_an_ensemble_row_takes_the_doc_offset_of_the_run_sh_it_ended(monkeypatch, tmp_path):
    base = {"recipe": "cpu", "machine": "a test machine", "date": "2026-01-01", "seed": 0, "minutes": 30.0,
            "command": "bash run.sh", "protocol": "direct"}  # fmt: skip
    lines = [{**base, "run": "vanilla", "dev_accuracy": 0.2, "pretrain_epochs": 70.0, "pretrain_doc_offset": 14},
             {**base, "run": "ensemble", "dev_accuracy": 0.25}]  # fmt: skip
    logged(monkeypatch, tmp_path)
    (tmp_path / "results" / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert "| ensemble of the variants (most confident answer) | direct | cpu, offset 14 |" in tables.results_table()


def test_the_readme_table_has_a_row_per_run_and_protocol_and_a_column_per_kind_of_machine(monkeypatch, tmp_path):
    logged(monkeypatch, tmp_path, gpu=GPU_RUN)
    lines = [PIPELINE_RUN, {**PIPELINE_RUN, "seed": 1, "dev_accuracy": 0.35, "pretrain_epochs": 91.0}]
    (tmp_path / "results" / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = tables.todays_table().splitlines()
    assert table[0] == "| run | protocol | a test machine, cpu recipe | A GPU, handout recipe |"
    assert [line for line in table if line.startswith("| rope ")] == ["| rope | direct | 30.0 (n=2) | 35.0 (n=1) |"]


def test_research_runs_and_earlier_recipes_stay_out_of_the_readme_table(monkeypatch, tmp_path):
    earlier = {**PIPELINE_RUN, "pretrain_doc_offset": 14}
    logged(monkeypatch, tmp_path, runs=earlier, time_to_accuracy=a_research_run(budget_fit=True))
    assert "| rope |" not in tables.todays_table()
    assert "| rope | direct | cpu, offset 14, 87 epochs in a budget |" in tables.results_table()


def test_machines_are_named_in_plain_words():
    assert tables.plain("AMD EPYC [family 25, model 17] (AVX512, bf16)") == "AMD EPYC, AVX-512 with bf16"
    assert tables.plain("Intel(R) Xeon(R) Processor [family 6, model 167] (AVX2, no bf16)") == (
        "Intel Xeon, AVX2 without bf16"
    )


def test_a_priced_step_shows_its_share_of_the_peak_and_a_paired_one_the_step_before(monkeypatch, tmp_path):
    part = {"forward": {"share": 0.25}, "backward": {"share": 0.4}, "optimizer": {"share": 0.35}}
    row = {"bench": "epoch", "cpu_name": "AMD EPYC [family 25, model 17] (AVX512, bf16)", "threads": 2,
           "preset": "handout", "variant": "vanilla", "batch_size": 128, "micro_batch": 32, "parts": part,
           "seconds_per_step": 1.0, "achieved_gflops": 190.0, "mfu": 0.46, "peak_gflops": 413.0,
           "paired_speedup": 1.6, "paired_with": {"commit": "00b442b1"},
           "paired_seconds": {"ours": [1.0, 0.9, 1.1], "theirs": [1.6, 1.7, 1.5]}}  # fmt: skip
    logged(monkeypatch, tmp_path, speed=row)
    (line,) = [line for line in tables.epoch_table().splitlines() if "vanilla" in line]
    assert line == (
        "| AMD EPYC, AVX-512 with bf16, 2 threads | vanilla, --preset handout, batch 128, micro-batches of 32 "
        "| 1.00 s (before, 00b442b: 1.60 s; 1.60x) | 190 (46% of 413) | 25%, 40%, 35% |"
    )
    assert tables.speed_table().count("\n") == 1  # the speed table's header only: the row is not a speed line
