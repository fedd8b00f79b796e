"""Specification of the settings that bench/finetune_sweep.py reads from its command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.finetune_sweep import finetune_args, parse_setting


def test_four_fields_finetune_every_block_with_adamw():
    assert parse_setting("5e-5,0.0,10,256") == {
        "lr": 5e-5, "dropout": 0.0, "epochs": 10, "batch": 256, "frozen": 0, "optimizer": "adamw"
    }  # fmt: skip


def test_fifth_field_freezes_blocks_and_sixth_names_the_optimizer():
    setting = parse_setting("1e-4,0.1,5,64,2,muon")
    assert (setting["frozen"], setting["optimizer"]) == (2, "muon")


@pytest.mark.parametrize("text", ["5e-5,0,10", "5e-5,0,10,256,0,sgd", "5e-5,0,ten,256", "5e-5,0,10,256,0,muon,1"])
def test_a_malformed_setting_exits_with_a_one_line_error(text):
    with pytest.raises(SystemExit, match="bad setting") as exit_info:
        parse_setting(text)
    assert "\n" not in str(exit_info.value)


def test_mix_corpus_adds_run_py_flag_to_the_finetuning_command_only_when_asked():
    setting = parse_setting("1e-4,0.0,5,256")
    plain = finetune_args("vanilla", Path("pre.params"), setting, 0, Path("ft.params"), mix_corpus=False)
    mixed = finetune_args("vanilla", Path("pre.params"), setting, 0, Path("ft.params"), mix_corpus=True)
    assert "--mix_corpus" not in plain
    assert mixed == plain + ["--mix_corpus"]
