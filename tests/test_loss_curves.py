"""Specification of how bench/loss_curves.py splits a run's logged step losses into epochs."""

from __future__ import annotations

import pytest
from torch.utils.tensorboard import SummaryWriter

from bench.loss_curves import epoch_losses


def write_log(folder, step_losses, epoch_ends):
    """A TensorBoard log like the trainer's: one train/loss per step (at wall time = its step
    number) and one train/epoch_seconds right after each epoch's last step."""
    writer = SummaryWriter(str(folder))
    for step, loss in enumerate(step_losses):
        writer.add_scalar("train/loss", loss, step, walltime=1000.0 + step)
        if step in epoch_ends:
            writer.add_scalar("train/epoch_seconds", 1.0, step, walltime=1000.0 + step + 0.5)
    writer.close()


def test_steps_logged_before_each_epoch_time_belong_to_that_epoch(tmp_path):
    write_log(tmp_path / "pretrain" / "myrun_0", [5.0, 4.0, 3.0, 2.0, 1.0], epoch_ends={2, 4})
    epochs = epoch_losses("pretrain", "myrun", expt=tmp_path)
    assert [list(e) for e in epochs] == [[5.0, 4.0, 3.0], [2.0, 1.0]]


def test_steps_of_an_unfinished_epoch_are_left_out(tmp_path):
    write_log(tmp_path / "pretrain" / "myrun_0", [5.0, 4.0, 3.0, 2.0], epoch_ends={1})
    epochs = epoch_losses("pretrain", "myrun", expt=tmp_path)
    assert [list(e) for e in epochs] == [[5.0, 4.0]]


def test_a_run_without_a_log_exits_with_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="no TensorBoard log") as exit_info:
        epoch_losses("pretrain", "missing", expt=tmp_path)
    assert "\n" not in str(exit_info.value)
