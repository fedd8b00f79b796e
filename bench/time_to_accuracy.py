"""Time to accuracy: wall-clock of pretrain -> finetune -> evaluate, and the dev accuracy reached.

    python bench/time_to_accuracy.py vanilla                 # the CPU recipe (--preset cpu)
    python bench/time_to_accuracy.py perceiver --seed 1 --max_epochs 100   # other flags go to run.py pretrain
    python bench/time_to_accuracy.py vanilla --snapshots 28,43,58   # also stop-early points
    python bench/time_to_accuracy.py vanilla --table                # the log as a markdown table
    python bench/time_to_accuracy.py vanilla --refinetune NAME      # run NAME's params, finetuned again
    python bench/time_to_accuracy.py rope --seed 1 --name NAME --resume   # an interrupted run, continued

Runs the three run.py commands as a user would, in a scratch folder
(bench/runs/<name>/), times each one, and appends one JSON line per run to
bench/results/time_to_accuracy.jsonl (config, seconds per step, final pretraining
loss, dev accuracy), the log of the research behind the CPU recipe.

--snapshots copies the pretraining checkpoint as it stood after each listed
number of minutes (or, for entries like 200ep, as soon as the TensorBoard log says
epoch 200 is done: the checkpoint must fall on that epoch's last step, e.g. --ckpt_every 100 with
23 steps per epoch and a multiple of 100 epochs); once the full run is done, each copy is finetuned and
evaluated like the final model, and logged as its own line: what a user who
had stopped pretraining at that point would have got (with the learning rate
not yet decayed, since the schedule was planned for the whole run). Its
pretraining time is the checkpoint's write time, measured from the start.
--resume continues an interrupted run from its pretraining checkpoint (run.py
pretrain --resume, with the same flags as the first attempt); its pretraining
time is then the training time summed over both attempts (the sidecar's
train_seconds: start-up and the lost part of the interrupted epoch are not in
it), and the line says "resumed": true.

A snapshot is the latest checkpoint written by then (every --ckpt_every steps,
100 by default: about 1.8 minutes on the Zen 1 EPYC), so two snapshots closer
than that may copy the same one; the later is then skipped.

"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "time_to_accuracy.jsonl"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))  # research.py

from research import LoggedEpochs, accuracy, cpu_name, predictions_sidecar, tensorboard_prefix  # noqa: E402

from config import RunConfig, time_budget, trainer_config  # noqa: E402


def in_repository(path: str) -> str:
    """`path` relative to the repository where it lies inside it (as logged), else as it is."""
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_absolute() and p.is_relative_to(ROOT) else path


def trainer_settings(sidecar: dict) -> dict:
    """The training settings of a params sidecar's resolved config, as the trainer config this script has
    always logged them (pretrain_config, finetune_config: config.trainer_config's fields but final_tokens,
    which depends on the data's size) with the epochs as planned and the time budget (config.time_budget)."""
    config = RunConfig(**{**sidecar["config"], "max_epochs": sidecar["planned_epochs"]})
    settings = asdict(trainer_config(config, pretrain_len=0))
    del settings["final_tokens"]
    budget_seconds, fit = time_budget(config)
    return {
        **settings,
        "budget_seconds": budget_seconds,
        "budget_fit": fit,
        "ckpt_path": in_repository(settings["ckpt_path"]),
    }


def timed(cmd: list[str], log: Path, snapshots: dict[str, Path] | None = None) -> tuple[float, str]:
    """Run cmd (output to log); returns (seconds, output). Stops the benchmark if the command fails.

    snapshots: {"30" (minutes) or "200ep" (epochs): destination}; the checkpoint
    next to the params being written is copied to each destination once that
    many minutes have passed or that epoch has finished.
    """
    t0 = time.time()
    pending = dict(snapshots or {})
    ckpt = Path(cmd[cmd.index("--writing_params_path") + 1] + ".ckpt") if pending else None
    # epochs done, from the run's TensorBoard log (expt/<function>/, as run.py is started here from ROOT)
    epochs_done = LoggedEpochs(ROOT / "expt" / cmd[2], tensorboard_prefix(cmd[2:]), t0) if pending else None
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        while proc.poll() is None:
            for when, dest in list(pending.items()):
                if when.endswith("ep"):
                    due = epochs_done() >= int(when[:-2])
                else:
                    due = time.time() - t0 >= float(when) * 60
                if due and ckpt.is_file():
                    del pending[when]
                    shutil.copy2(ckpt, dest)  # the checkpoint is replaced atomically, so the copy is whole
                    seconds = round(os.path.getmtime(dest) - t0, 1)
                    dest.with_suffix(".json").write_text(json.dumps({"when": when, "pretrain_seconds": seconds}))
            time.sleep(1)
    text = log.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[1:4])} failed with code {proc.returncode}; see {log}")
    return time.time() - t0, text


def finetune_and_evaluate(run: list[str], common: list[str], pre_params: Path, out: Path, tag: str) -> dict:
    """Finetune `pre_params` and evaluate on dev; returns the seconds of each and the dev accuracy."""
    ft_params = out / f"{tag}finetune.params"
    steps = [
        ("finetune", ["finetune", *common, "--reading_params_path", str(pre_params),
                      "--writing_params_path", str(ft_params), "--finetune_corpus_path", "birth_places_train.tsv"]),
        ("evaluate", ["evaluate", *common, "--reading_params_path", str(ft_params), "--eval_corpus_path",
                      "birth_dev.tsv", "--outputs_path", str(out / f"{tag}dev.predictions")]),
    ]  # fmt: skip
    record = {}
    for step, cmd in steps:
        seconds, _ = timed(run + cmd, out / f"{tag}{step}.log")
        record[f"{step}_seconds"] = round(seconds, 1)
        if step == "finetune":  # the rate, dropout, batch and epochs the preset chose
            sidecar = json.loads(ft_params.with_suffix(".params.json").read_text())
            record["finetune_config"] = {**trainer_settings(sidecar), "dropout": sidecar["config"]["dropout"]}
        if step == "evaluate":  # from the predictions' sidecar
            record["dev_accuracy"] = accuracy(predictions_sidecar(out / f"{tag}dev.predictions"))
    return record


def label(when: str) -> str:
    """A --snapshots entry as it appears in file and run names: "58" -> "58min", "200ep" -> "200ep"."""
    return when if when.endswith("ep") else f"{float(when):g}min"


def append(record: dict) -> None:
    record["total_seconds"] = round(sum(record[f"{s}_seconds"] for s in ("pretrain", "finetune", "evaluate")), 1)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"{record['name']}: dev accuracy {record['dev_accuracy']:.1%} after {record['total_seconds'] / 60:.1f} min "
        f"(pretrain {record['pretrain_seconds'] / 60:.1f} min); appended to {RESULTS}",
        flush=True,
    )


def table() -> str:
    """Markdown table of every logged run (bench/results/time_to_accuracy.jsonl), oldest first."""
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    out = [
        "| run | batch, lr, length | other pretraining flags | finetune lr, dropout | pretrain | total | dev accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["pretrain_config"]
        steps = f"{r['pretrain_steps']:,} steps" if "snapshot_of" in r else f"{c['max_epochs']} epochs"
        done = r.get("pretrain_epochs_done")
        if "snapshot_of" not in r and done is not None and done < c["max_epochs"]:
            steps = f"{done:.0f} of {c['max_epochs']} epochs"  # a --budget_minutes ran out first
        flags = shlex.join(r["pretrain_flags"])  # quoted, so "--doc_context 'Where was '" shows its space
        flags = re.sub(r"--(max_epochs|batch_size|pretrain_lr) \S+ ?", "", flags).strip()
        if r.get("pretrain_doc_offset") and "--doc_offset" not in flags:
            flags = f"{flags} --doc_offset {r['pretrain_doc_offset']} (preset)".strip()
        if r.get("pretrain_doc_context") and "--doc_context" not in flags:
            flags = f"{flags} --doc_context {shlex.quote(r['pretrain_doc_context'])} (preset)".strip()
        if r.get("bottleneck_dim", 64) != 64:
            flags = f"--bottleneck_dim {r['bottleneck_dim']} {flags}".strip()
        if r["preset"] != "cpu":
            flags = f"{flags} (--preset {r['preset']})".strip()
        flags = flags or "-"
        # runs before finetune_config was logged all finetuned with the handout's 6e-4 and dropout 0.1
        ft = r.get("finetune_config", {"learning_rate": 6e-4, "dropout": 0.1})
        out.append(
            f"| {r['name']} | {c['batch_size']}, {c['learning_rate']:g}, {steps} | {flags} "
            f"| {ft['learning_rate']:g}, {ft['dropout']:g} "
            f"| {r['pretrain_seconds'] / 60:.1f} min | {r['total_seconds'] / 60:.1f} min | {r['dev_accuracy']:.1%} |"
        )
    return "\n".join(out)


def common_flags(variant: str, preset: str, seed: int, name: str, bottleneck_dim: int = 64) -> list[str]:
    """The run.py arguments shared by the pretrain, finetune and evaluate commands of a run."""
    common = [variant, "wiki.txt", "--preset", preset, "--seed", str(seed), "--tb_expt_name", name]
    return common + (["--bottleneck_dim", str(bottleneck_dim)] if variant == "perceiver" else [])


def refinetune(name: str) -> None:
    """Finetune and evaluate a logged run's pretrained params again, with the preset's current finetuning.

    Each line of run `name` (the final model and its snapshots) is logged again
    as "<line name>, refinetuned", keeping its pretraining time: what the run
    would have scored had the current finetuning settings existed then.
    """
    rows = {}
    for line in RESULTS.read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if r.get("name") == name or r.get("snapshot_of") == name:
            rows[r["name"]] = r  # the latest line of each name
    if not rows:
        sys.exit(f"error: no run named {name} in {RESULTS}")
    out = ROOT / "bench" / "runs" / name
    run = [sys.executable, "src/run.py"]
    for old in rows.values():
        tag = f"snap{old['name'].split('@')[1]}." if "@" in old["name"] else ""
        pre_params = out / f"{tag}pretrain.params"
        if not pre_params.is_file():
            sys.exit(f"error: {pre_params} is gone; cannot refinetune {old['name']}")
        kept = {k: v for k, v in old.items() if k not in ("finetune_config", "note") and not k.startswith(
            ("finetune_", "evaluate_", "dev_", "total_"))}  # fmt: skip
        record = {**kept, "name": f"{old['name']}, refinetuned", "refinetuned_at": time.strftime("%Y-%m-%d %H:%M")}
        common = common_flags(old["variant"], old["preset"], old["seed"], name, old.get("bottleneck_dim", 64))
        append({**record, **finetune_and_evaluate(run, common, pre_params, out, f"re{tag or 'final.'}")})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant", choices=["vanilla", "perceiver", "rope"], help="which model")
    p.add_argument("--preset", default="cpu", help="run.py --preset for pretraining and finetuning")
    p.add_argument("--seed", type=int, default=0, help="run.py --seed")
    p.add_argument("--name", default=None, help="run folder name (default: variant_preset_seed)")
    p.add_argument("--snapshots", default="", help="comma-separated minutes (58) or epochs (200ep) to also evaluate at")
    p.add_argument("--bottleneck_dim", type=int, default=64, help="perceiver bottleneck length m (the handout's 64)")
    p.add_argument("--pretrain_order", default=None, help="run.py pretrain --order (research: the batches' order)")
    p.add_argument("--pretrain_decay", default=None, help="run.py pretrain --decay (research: which weights decay)")
    p.add_argument("--resume", action="store_true", help="continue run NAME's interrupted pretraining (see above)")
    p.add_argument("--table", action="store_true", help="only print the table of the logged runs")
    p.add_argument("--refinetune", metavar="NAME", help="only finetune + evaluate run NAME's params again (see above)")
    args, args.pretrain_flags = p.parse_known_args()  # unknown flags go to run.py pretrain
    if args.table:
        print(table())
        return
    if args.refinetune:
        refinetune(args.refinetune)
        return
    name = args.name or f"{args.variant}_{args.preset}_seed{args.seed}"
    out = ROOT / "bench" / "runs" / name
    out.mkdir(parents=True, exist_ok=True)
    run = [sys.executable, "src/run.py"]
    common = common_flags(args.variant, args.preset, args.seed, name, args.bottleneck_dim)
    pre_params = out / "pretrain.params"
    snapshots = {m: out / f"snap{label(m)}.ckpt" for m in args.snapshots.split(",") if m}
    record: dict = {
        "name": name,
        "variant": args.variant,
        "preset": args.preset,
        "seed": args.seed,
        "pretrain_flags": args.pretrain_flags,
        **({"bottleneck_dim": args.bottleneck_dim} if args.variant == "perceiver" else {}),
        "machine": f"{platform.machine()}, {platform.node()}",
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        **({"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}),
        "started": time.strftime("%Y-%m-%d %H:%M"),
    }
    cmd = ["pretrain", *common, "--writing_params_path", str(pre_params), *args.pretrain_flags]
    variant = [f"--{k}={v}" for k, v in (("order", args.pretrain_order), ("decay", args.pretrain_decay)) if v]
    if variant:  # the trainer's batching or decay changed, for research (run.py's hidden flags)
        cmd += variant
        record["pretrain_trainer_variant"] = variant
    log = out / "pretrain.log"
    if args.resume:
        if not Path(f"{pre_params}.ckpt").is_file():
            sys.exit(f"error: --resume: no checkpoint {pre_params}.ckpt")
        if log.is_file():
            log.replace(out / "pretrain.interrupted.log")  # the first attempt's log, kept
        cmd.append("--resume")
    seconds, _ = timed(run + cmd, log, snapshots)
    sidecar = json.loads((out / "pretrain.params.json").read_text())
    if args.resume:
        seconds = sidecar["train_seconds"]  # both attempts' training time
        record["resumed"] = True
    record["pretrain_seconds"] = round(seconds, 1)
    print(f"{name}: pretrain took {seconds:.0f} s", flush=True)
    record["pretrain_steps"] = sidecar["steps"]
    record["pretrain_final_loss"] = sidecar["final_loss"]
    record["pretrain_config"] = trainer_settings(sidecar)
    record["pretrain_doc_offset"] = sidecar["config"]["doc_offset"]  # may come from the preset, not the flags
    record["pretrain_epochs_done"] = sidecar.get("epochs_done")  # fewer than planned if a budget ran out
    append({**record, **finetune_and_evaluate(run, common, pre_params, out, "")})
    batches_per_epoch = round(sidecar["steps"] / sidecar["epochs_done"])  # the same in every epoch

    taken: dict[float, str] = {}  # checkpoint write time -> the snapshot that copied it
    for when, ckpt_copy in snapshots.items():
        if not ckpt_copy.is_file():
            print(f"{name}: no snapshot at {label(when)} (pretraining ended first)")
            continue
        timing = json.loads(ckpt_copy.with_suffix(".json").read_text())
        if timing["pretrain_seconds"] in taken:  # no checkpoint was written between the two snapshots
            print(f"{name}: the snapshot at {label(when)} is the one at {taken[timing['pretrain_seconds']]}; skipped")
            continue
        taken[timing["pretrain_seconds"]] = label(when)
        ckpt = torch.load(ckpt_copy, weights_only=True)
        snap_params = out / f"snap{label(when)}.pretrain.params"
        torch.save(ckpt["model"], snap_params)
        snap = {
            **record,
            "name": f"{name}@{label(when)}",
            "snapshot_of": name,
            "pretrain_seconds": timing["pretrain_seconds"],
            "pretrain_steps": ckpt["step"],
            "pretrain_final_loss": ckpt["losses"][-1],
            # the snapshot's own progress, not the full run's
            "pretrain_epochs_done": round(ckpt["epoch"] + ckpt["batch_in_epoch"] / batches_per_epoch, 3),
        }
        append({**snap, **finetune_and_evaluate(run, common, snap_params, out, f"snap{label(when)}.")})


if __name__ == "__main__":
    main()
