"""Specification of the shell scripts: run.sh checks its settings, plans its pretrainings' minutes and
stops at the first failed step; setup.sh leaves the caller's shell as it was and reinstalls only when the requirements change."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, real_data

import run
from config import CONTROL_SHARE, PRETRAIN_SHARE, STEP_MARGIN, RunPlan, plan_run
from utils import UserError


def run_sh(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT_DIR": str(tmp_path / "out"), **settings}
    return subprocess.run(["bash", str(REPO_ROOT / "run.sh")], capture_output=True, text=True, env=env, timeout=300)


def refused_before_any_step(proc: subprocess.CompletedProcess, tmp_path, line: str) -> None:
    """run.sh said `line` alone on stderr, exit code 2, and ran nothing."""
    assert proc.returncode == 2 and proc.stderr.splitlines() == [line]
    assert proc.stdout == "" and not (tmp_path / "out").exists()


def test_run_sh_refuses_a_bad_setting_in_one_line_before_any_step(tmp_path):
    proc = run_sh(tmp_path, VARIANTS="bogus")
    refused_before_any_step(
        proc, tmp_path, "run.sh: VARIANTS: unknown variant 'bogus'; choose from: vanilla perceiver rope"
    )


@pytest.mark.parametrize(
    ("setting", "value"),
    [("SEED", "x"), ("SEED", str(2**32)), ("TOTAL_MINUTES", "abc"), ("TOTAL_MINUTES", "0"), ("PRESET", "gpu")]
    + [("PRETRAIN_EPOCHS", "0"), ("FINETUNE_EPOCHS", "1.5"), ("NOPRETRAIN_EPOCHS", "-1"), ("RECORD", "yes")]
    + [("PLAN_ONLY", "yes")],
)
def test_run_sh_names_each_bad_setting_before_any_step(tmp_path, setting, value):
    proc = run_sh(tmp_path, **{setting: value})
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"run.sh: {setting} ") and f"'{value}'" in line
    assert proc.stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["", " ", "\n\t "])
def test_an_empty_or_blank_variants_is_refused_not_taken_for_all_three(tmp_path, value):
    proc = run_sh(tmp_path, VARIANTS=value)
    line = "run.sh: VARIANTS is empty; give some of: vanilla perceiver rope (or unset it for all three)"
    refused_before_any_step(proc, tmp_path, line)


def test_extra_flags_that_a_step_would_refuse_are_refused_in_one_line_before_the_first_step(tmp_path):
    proc = run_sh(tmp_path, EXTRA_FLAGS="--n_layer 2\t--seed\n5", PRESET="cpu")
    assert proc.returncode == 2
    said = [line for line in proc.stderr.splitlines() if line.startswith("run.sh:")]  # the set-up may warn first
    assert said == ["run.sh: EXTRA_FLAGS must not set --seed (--seed 5): set SEED instead, e.g. SEED=5"]
    assert "== " not in proc.stdout and not (tmp_path / "out").exists()


def extra_flags_problem(flags: str) -> str:
    """What run.sh says of EXTRA_FLAGS `flags` with the cpu preset on every variant (run.extra_flags)."""
    with pytest.raises(UserError) as refused:
        run.extra_flags(flags.split(), "cpu", ["vanilla", "perceiver", "rope"])
    return str(refused.value)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ("--seed 5", "must not set --seed (--seed 5): set SEED instead, e.g. SEED=5"),
        ("--see=5", "must not set --seed (--see=5): set SEED instead"),
        ("--preset handout", "must not set --preset (--preset handout): set PRESET instead"),
        ("--pre handout", "must not set --preset (--pre handout): set PRESET instead"),
        ("--no_such_flag", "unrecognized arguments: --no_such_flag"),
        ("--help", "-h or --help would print help instead"),
        ("-h", "-h or --help would print help instead"),
        ("--n_layer x", "argument --n_layer: invalid int value: 'x'"),
        ("--threads 0", "--threads must be between 1 and"),
        ("--n_embd 33", "--n_embd 33 must be divisible by --n_head 8"),
        ("--n_layer 1", "the perceiver needs --n_layer of at least 2"),
        ("--bottleneck_dim 0", "--bottleneck_dim must be between 1 and 128, got 0"),
        ("--tb_expt_name a/b", "--tb_expt_name must be a plain name"),
        ("--tb_dir /dev/null", "must not set --tb_dir (--tb_dir /dev/null): run.sh names the files"),
        ("--reading_params_path nope.params", "must not set --reading_params_path"),
        ("--max_epochs 3", "set PRETRAIN_EPOCHS, FINETUNE_EPOCHS or NOPRETRAIN_EPOCHS instead"),
        ("--budget_minutes 3", "run.sh plans the budgets to TOTAL_MINUTES"),
        ("--recite", "run.sh runs both protocols"),
        ("--recite_chars 20", "--recite_chars is for finetune --recite"),
    ],
)
def test_extra_flags_that_a_step_would_refuse_are_named_with_the_reason(flags, said):
    assert said in extra_flags_problem(flags)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU takes --device cuda")
def test_extra_flags_asking_for_a_gpu_on_a_machine_without_one_are_refused():
    assert "no CUDA GPU is available" in extra_flags_problem("--device cuda")


def test_extra_flags_go_to_the_commands_that_take_them():
    taken = run.extra_flags(["--n_layer", "2", "--fp32", "--pret", "1e-3", "--max_steps", "4"], "cpu", ["vanilla"])
    assert taken == {
        "pretrain": ["--n_layer", "2", "--fp32", "--pret", "1e-3", "--max_steps", "4"],
        "finetune": ["--n_layer", "2", "--fp32", "--max_steps", "4"],
        "evaluate": ["--n_layer", "2"],
    }


def test_an_out_dir_that_is_a_symlink_loop_or_in_a_folder_without_write_permission_is_refused(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    proc = run_sh(tmp_path, OUT_DIR=str(tmp_path / "loop"))
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"run.sh: OUT_DIR '{tmp_path / 'loop'}' is a symlink that cannot be followed"
    ]
    if os.geteuid() != 0:  # root may write anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        proc = run_sh(tmp_path, OUT_DIR=str(tmp_path / "ro" / "out"))
        assert proc.returncode == 2 and "is not writable" in proc.stderr


def test_run_sh_reached_through_a_symlink_runs_from_its_checkout(tmp_path):
    (tmp_path / "run.sh").symlink_to(REPO_ROOT / "run.sh")
    env = {**os.environ, "OUT_DIR": str(tmp_path / "out"), "VARIANTS": "bogus"}
    proc = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("run.sh: VARIANTS: unknown variant 'bogus'")


def git_checkout() -> None:
    if not (REPO_ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: run.sh cannot tell which files git tracks")


@pytest.mark.parametrize("how", ["relative", "absolute", "through a symlink"])
def test_an_out_dir_holding_files_git_tracks_is_refused_and_left_as_it_was(tmp_path, how):
    git_checkout()
    results = REPO_ROOT / "bench" / "results"
    (tmp_path / "link").symlink_to(results)
    out_dir = {"relative": "bench/results", "absolute": str(results), "through a symlink": str(tmp_path / "link")}[how]
    before = sorted((p.name, p.stat().st_mtime_ns) for p in results.iterdir())
    proc = run_sh(tmp_path, OUT_DIR=out_dir)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"run.sh: OUT_DIR '{out_dir}' holds files tracked by git (bench/results/")
    assert proc.stdout == ""
    assert sorted((p.name, p.stat().st_mtime_ns) for p in results.iterdir()) == before


@pytest.mark.parametrize("out_dir", [".git/x", ".git"])
def test_an_out_dir_inside_gits_own_folder_is_refused(tmp_path, out_dir):
    proc = run_sh(tmp_path, OUT_DIR=out_dir)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"run.sh: OUT_DIR '{out_dir}' is inside git's own folder; choose another, e.g. outputs"
    ]
    assert not (REPO_ROOT / ".git" / "x").exists()


def test_an_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("mine")
    proc = run_sh(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"run.sh: OUT_DIR '{tmp_path / 'out'}' is not a folder; give a folder name"]
    assert proc.stdout == "" and (tmp_path / "out").read_text() == "mine"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_kill_stops_the_step_running_and_then_run_sh(tmp_path, sig):
    root = fake_checkout(tmp_path / "checkout")
    shutil.copy(REPO_ROOT / "run.sh", root / "run.sh")
    bin_dir = root / ".venv" / "bin"
    # A step that runs until it is signalled, then says so, as run.py stops (and checkpoints) on SIGTERM or SIGHUP.
    (bin_dir / "python").write_text(
        '#!/bin/bash\necho "$@" >>"$(dirname "$0")/calls.log"\n'
        'if [ "$1" = src/run.py ]; then\n'
        '  trap \'kill $!; echo "stopped: $2" >>"$(dirname "$0")/calls.log"; exit 130\' TERM HUP\n'
        '  touch "$(dirname "$0")/running"; sleep 60 & wait\nfi\n'
    )
    env = {**os.environ, "OUT_DIR": str(tmp_path / "out"), "PRESET": "cpu"}
    proc = subprocess.Popen(["bash", str(root / "run.sh")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (bin_dir / "running").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert err.splitlines()[-1].startswith("run.sh: stopped by a signal during step vanilla_nopretrain_finetune")
    steps = [line for line in calls(root).splitlines() if line.startswith(("src/run.py", "stopped"))]
    assert steps[1:] == ["stopped: finetune"]  # the step running was stopped, and no other started


def test_run_sh_stops_at_the_first_failed_step_naming_it_and_its_log_and_writes_no_report(tmp_path):
    real_data("birth_dev.tsv")  # the London step before the failing one reads it
    proc = run_sh(tmp_path, EXTRA_FLAGS="--finetune_lr 1e30", PRESET="cpu")  # the loss diverges at once
    out = tmp_path / "out"
    assert proc.returncode != 0
    log = out / "vanilla_nopretrain_finetune.log"
    assert f"run.sh: step vanilla_nopretrain_finetune failed (exit code 2); see {log}" in proc.stderr
    assert "error: the loss became nan" in log.read_text()
    assert "== vanilla_nopretrain_dev" not in proc.stdout and "run.sh: done" not in proc.stdout
    assert (out / "times.txt").read_text().split()[0::2] == ["london"]
    assert not (out / "report.md").exists() and not list(out.glob("*.params"))


# ---------------------------------------------------------------------------
# setup.sh, in a copy of the checkout whose .venv/bin/python only logs how it was called


def fake_checkout(root: Path, python_status: int = 0) -> Path:
    """setup.sh and the requirements in `root`, with a stand-in python that logs its arguments."""
    root.mkdir(parents=True)
    for name in ("setup.sh", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(REPO_ROOT / name, root / name)
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >>"$(dirname "$0")/calls.log"\nexit {python_status}\n')
    python.chmod(0o755)
    return root


def calls(root: Path) -> str:
    log = root / ".venv" / "bin" / "calls.log"
    return log.read_text() if log.exists() else ""


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


SHELL_STATE = 'echo "state: $- $(shopt -qo pipefail && echo pipefail-on || echo pipefail-off)"'


@pytest.mark.parametrize("options", ["set +euo pipefail", "set -euo pipefail", "set -u"])
def test_sourcing_setup_leaves_the_callers_shell_options_as_they_were(tmp_path, options):
    root = fake_checkout(tmp_path / "checkout")
    proc = bash(f'{options}; {SHELL_STATE}; source "{root}/setup.sh"; {SHELL_STATE}; echo "$PATH"')
    assert proc.returncode == 0, proc.stderr
    before, after = [line for line in proc.stdout.splitlines() if line.startswith("state: ")]
    path = proc.stdout.splitlines()[-1]
    assert after == before
    assert path.startswith(f"{root}/.venv/bin:")


def test_a_failed_setup_returns_1_without_closing_the_callers_shell(tmp_path):
    root = fake_checkout(tmp_path / "checkout", python_status=1)
    proc = bash(f'source "{root}/setup.sh"; echo "still here: $?"')
    assert proc.stdout.splitlines()[-1] == "still here: 1"


def test_a_failed_install_stops_the_setup_before_its_stamp(tmp_path):
    root = fake_checkout(tmp_path / "checkout", python_status=1)
    assert bash(f'source "{root}/setup.sh"').returncode == 1
    assert not list((root / ".venv").glob(".installed-*"))
    assert "get_data.py" not in calls(root)


def test_a_venv_without_python_is_refused_in_one_line(tmp_path):
    root = fake_checkout(tmp_path / "checkout")
    shutil.rmtree(root / ".venv")
    (root / ".venv").symlink_to(tmp_path / "gone")
    proc = bash(f'source "{root}/setup.sh"')
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"setup: {root}/.venv exists but holds no Python; remove it and run again"


def test_a_moved_checkout_does_not_reinstall(tmp_path):
    root = fake_checkout(tmp_path / "a")
    assert bash(f'source "{root}/setup.sh"').returncode == 0
    assert "-m pip install --progress-bar on -r" in calls(root)
    moved = tmp_path / "elsewhere" / "b"
    moved.parent.mkdir()
    root.rename(moved)
    (moved / ".venv" / "bin" / "calls.log").unlink()
    assert bash(f'source "{moved}/setup.sh"').returncode == 0
    assert "pip" not in calls(moved) and "get_data.py" in calls(moved)


def test_changed_requirements_reinstall(tmp_path):
    root = fake_checkout(tmp_path / "a")
    assert bash(f'source "{root}/setup.sh" dev').returncode == 0
    (root / ".venv" / "bin" / "calls.log").unlink()
    with open(root / "requirements.txt", "a") as f:
        f.write("einops\n")
    assert bash(f'source "{root}/setup.sh" dev').returncode == 0
    assert "-m pip install --progress-bar on -r" in calls(root)


# ---------------------------------------------------------------------------
# run.sh's report step, in a fake checkout whose every python step only logs how it was called


def fake_run(tmp_path: Path, **settings: str) -> tuple[str, str]:
    """Run run.sh (preset cpu) in a fake checkout: (what it printed, how it called python)."""
    root = fake_checkout(tmp_path / "checkout")
    shutil.copy(REPO_ROOT / "run.sh", root / "run.sh")
    env = {**os.environ, "OUT_DIR": str(tmp_path / "out"), "PRESET": "cpu", **settings}
    proc = subprocess.run(["bash", str(root / "run.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, calls(root)


def report_call(tmp_path: Path, **settings: str) -> str:
    """The arguments a fake run (see fake_run) gave bench/report.py."""
    (line,) = [line for line in fake_run(tmp_path, **settings)[1].splitlines() if line.startswith("bench/report.py")]
    return line


def test_a_users_run_writes_its_report_into_out_dir_and_records_nothing(tmp_path):
    line = report_call(tmp_path)
    assert f"--out {tmp_path / 'out'}/report.md" in line
    assert "--record" not in line and line.count("--command bash run.sh") == 1


def test_a_recorded_run_names_the_settings_that_changed_what_ran(tmp_path):
    line = report_call(tmp_path, RECORD="1", TOTAL_MINUTES="90", VARIANTS="vanilla rope")
    assert line.endswith('--command VARIANTS="vanilla rope" TOTAL_MINUTES=90 bash run.sh --record')
    assert "--out" not in line


def test_a_smoke_runs_command_names_every_setting_that_differs_from_a_full_run(tmp_path):
    line = report_call(tmp_path, PRETRAIN_EPOCHS="2", FINETUNE_EPOCHS="1", NOPRETRAIN_EPOCHS="1",
                       EXTRA_FLAGS="--fp32", TOTAL_MINUTES="5")  # fmt: skip
    command = line.split("--command ", 1)[1]
    assert command.startswith('EXTRA_FLAGS="--fp32" PRETRAIN_EPOCHS=2 FINETUNE_EPOCHS=1 NOPRETRAIN_EPOCHS=1 ')
    assert "TOTAL_MINUTES=5 bash run.sh" in command


def test_every_step_says_how_many_are_done_and_the_time_so_far(tmp_path):
    out, _ = fake_run(tmp_path, VARIANTS="vanilla rope")
    done = [line for line in out.splitlines() if line.startswith("run.sh: step ")]
    assert len(done) == 3 + 7 * 2  # london, two from scratch, seven per variant
    assert done[0].startswith("run.sh: step 1 of 17 done (london, ") and "min so far" in done[-1]


def test_a_run_without_a_plan_says_how_long_it_takes_once_its_first_variant_is_done(tmp_path):
    out, _ = fake_run(tmp_path, PRESET="handout", VARIANTS="vanilla rope")
    lines = out.splitlines()
    said = [
        i for i, line in enumerate(lines) if line.startswith("run.sh: at the pace of vanilla's steps the whole run")
    ]
    assert len(said) == 1 and lines[said[0] - 1].startswith("run.sh: step 10 of 17 done (vanilla_recite_test, ")


def test_all_steps_of_one_run_log_into_one_tensorboard_folder(tmp_path):
    _, log = fake_run(tmp_path, VARIANTS="rope")
    steps = [line for line in log.splitlines() if line.startswith("src/run.py ")]
    folders = {line.split("--tb_dir ")[1].split()[0] for line in steps}
    assert len(steps) == 9 and len(folders) == 1 and folders.pop().startswith("expt/run.sh_")


@pytest.mark.parametrize("sep", ["\n", "\t", " \n\t "])
def test_variants_are_words_on_any_whitespace(tmp_path, sep):
    out, log = fake_run(tmp_path, VARIANTS=f"vanilla{sep}rope")
    pretrained = [line.split()[2] for line in log.splitlines() if line.startswith("src/run.py pretrain ")]
    assert pretrained == ["vanilla", "rope"]
    assert "variants: vanilla rope;" in out and "the 2 pretrainings" in out


def test_the_seed_every_step_uses_is_the_one_the_header_and_report_state(tmp_path):
    out, log = fake_run(tmp_path, SEED="007", VARIANTS="rope")
    steps = [line for line in log.splitlines() if line.startswith("src/run.py ")]
    assert steps and all(" --seed 7" in line and line.count("--seed") == 1 for line in steps)
    assert "seed 7," in out
    (report,) = [line for line in log.splitlines() if line.startswith("bench/report.py")]
    assert "--seed 7 " in report


# ---------------------------------------------------------------------------
# run.sh's plan with the cpu preset (config.plan_run), from an epoch of questions and a dev evaluation

THREE = ["vanilla", "perceiver", "rope"]
SLOW = {"question_epoch_seconds": 41.2, "dev_seconds": 15.0}  # a 2-core Zen 3 (AVX2, bf16 emulated)
FAST = {"question_epoch_seconds": 7.6, "dev_seconds": 5.0}  # a 2-core Zen 4 (AVX-512 with bf16)


def plan(machine: dict, variants: list[str] = THREE, total: float = 120, **epochs) -> RunPlan:
    return plan_run(total, machine["question_epoch_seconds"], machine["dev_seconds"], variants, 64, **epochs)


def test_on_a_slow_cpu_each_of_three_pretrainings_gets_a_fifth_of_the_run_and_the_plan_fits():
    slow = plan(SLOW)
    assert slow.minutes["vanilla_pretrain"] >= 0.2 * 120  # 24 minutes each
    assert sum(slow.minutes.values()) <= 120


def test_on_a_slow_cpu_the_readers_and_the_control_train_fewer_epochs_instead_of_the_pretrainings():
    slow, fast = plan(SLOW), plan(FAST)
    assert slow.epochs["rope_reader"] < fast.epochs["rope_reader"] == 10  # the preset's, whole where they fit
    assert slow.epochs["vanilla_nopretrain_finetune"] < fast.epochs["vanilla_nopretrain_finetune"] <= 75
    assert slow.minutes["vanilla_finetune"] > 5 * 41.2 / 60  # the finetunes stay whole (5 epochs)


def test_the_control_is_planned_to_at_most_its_share_of_the_run():
    for machine in (SLOW, FAST):
        assert plan(machine).minutes["vanilla_nopretrain_finetune"] <= CONTROL_SHARE * 120 + STEP_MARGIN / 60


def test_the_pretrainings_get_at_least_their_share_while_the_other_steps_leave_room():
    for machine in (SLOW, FAST):
        assert 3 * plan(machine).minutes["rope_pretrain"] >= PRETRAIN_SHARE * 120


def test_the_perceivers_shorter_recitation_leaves_more_time_to_pretrain():
    with_perceiver = plan(FAST, ["vanilla", "perceiver"]).minutes["vanilla_pretrain"]
    assert with_perceiver > plan(FAST, ["vanilla", "rope"]).minutes["vanilla_pretrain"]


def test_a_run_with_no_time_left_still_pretrains_for_a_minute_and_reads_for_an_epoch():
    tight = plan(SLOW, total=10)
    assert tight.minutes["rope_pretrain"] == 1.0
    assert tight.epochs == {
        "vanilla_nopretrain_finetune": 1,
        "vanilla_reader": 1,
        "perceiver_reader": 1,
        "rope_reader": 1,
    }


def test_a_plan_made_once_the_control_ran_counts_its_seconds_and_plans_no_epochs_for_it():
    after = plan_run(120, 41.2, 15, THREE, 64, control_seconds=300)
    assert after.minutes["vanilla_nopretrain_finetune"] == 5.0 and "vanilla_nopretrain_finetune" not in after.epochs


def test_the_plan_follows_the_epochs_a_smoke_run_asks_for():
    smoke = plan(FAST, nopretrain_epochs=1, finetune_epochs=1)
    assert set(smoke.epochs.values()) == {1}
    assert smoke.minutes["vanilla_finetune"] < plan(FAST).minutes["vanilla_finetune"]


def test_the_plan_names_every_step_run_sh_runs_with_its_minutes(tmp_path):
    fake_run(tmp_path, VARIANTS="vanilla rope")
    steps = (tmp_path / "out" / "times.txt").read_text().split()[0::2]
    lines = plan(SLOW, ["vanilla", "rope"]).lines(120)
    assert [line.split()[0] for line in lines[:-1]] == steps
    assert all(line.split()[2] == "min" for line in lines[:-1])


def test_plan_only_says_the_plan_for_the_given_figures_and_runs_nothing(tmp_path):
    proc = run_sh(tmp_path, PLAN_ONLY="1", QUESTION_EPOCH_SECONDS="41.2", DEV_SECONDS="15", PRESET="cpu")
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.split(
        "run.sh: the plan for TOTAL_MINUTES=120, at 41.2 s an epoch of questions, 15.0 s a dev evaluation:\n"
    )[1]
    assert said.splitlines() == plan(SLOW).lines(120)
    assert not (tmp_path / "out").exists()


def test_the_figures_of_a_plan_are_refused_without_plan_only(tmp_path):
    proc = run_sh(tmp_path, DEV_SECONDS="15")
    refused_before_any_step(
        proc, tmp_path, "run.sh: QUESTION_EPOCH_SECONDS and DEV_SECONDS are for PLAN_ONLY=1 (a run measures them)"
    )
