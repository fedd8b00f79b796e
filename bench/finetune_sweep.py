"""Finetuning settings compared on one pretrained model: dev accuracy of each.

    python bench/finetune_sweep.py vanilla bench/runs/offset14_480ep_seed0/pretrain.params \\
        6e-4,0.1,10,256 6e-4,0.0,10,256 3e-4,0.0,20,64 5e-5,0.0,10,256,2 5e-5,0.0,10,256,0,muon [--seeds 0,1]

Each setting is "lr,dropout,epochs,batch" with an optional fifth field, the
blocks kept frozen (run.py --freeze_blocks; default 0), and an optional sixth,
the optimizer (run.py --optimizer: adamw, the default, or muon); --mix_corpus adds run.py's
--mix_corpus to every setting. For each setting and seed, the
pretrained params are finetuned on birth_places_train.tsv with run.py (fast
path) and evaluated on birth_dev.tsv; the accuracy and seconds are printed and
appended to bench/results/finetune_sweep.jsonl. Finetuning takes about a minute
per setting on the 2-core Xeon with AMX, five to six on the Zen 1 EPYC (fp32). Choosing settings by dev accuracy tunes on dev:
report the choice with that caveat, and confirm it on a second pretrained model.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from time_to_accuracy import timed  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "finetune_sweep.jsonl"
SETTING_FORM = '"lr,dropout,epochs,batch[,frozen[,adamw|muon]]"'


def parse_setting(text: str) -> dict:
    """ "6e-4,0.1,10,256[,2[,muon]]" -> {"lr": 6e-4, "dropout": 0.1, "epochs": 10, "batch": 256, "frozen": 2,
    "optimizer": "muon"}; a bad setting exits with a one-line error."""
    fields = text.split(",")
    if not 4 <= len(fields) <= 6 or (len(fields) == 6 and fields[5] not in ("adamw", "muon")):
        sys.exit(f"finetune_sweep.py: bad setting {text!r}: expected {SETTING_FORM}")
    try:
        setting = {"lr": float(fields[0]), "dropout": float(fields[1]), "epochs": int(fields[2]),
                   "batch": int(fields[3]), "frozen": int(fields[4]) if len(fields) > 4 else 0}  # fmt: skip
    except ValueError:
        sys.exit(f"finetune_sweep.py: bad setting {text!r}: expected {SETTING_FORM}")
    return {**setting, "optimizer": fields[5] if len(fields) > 5 else "adamw"}


def common_args(variant: str, seed: int) -> list[str]:
    """The run.py arguments that finetuning and evaluation share."""
    common = [variant, "wiki.txt", "--seed", str(seed), "--tb_expt_name", "finetune_sweep"]
    return common + (["--bottleneck_dim", "64"] if variant == "perceiver" else [])


def finetune_args(variant: str, params: Path, setting: dict, seed: int, out: Path, mix_corpus: bool) -> list[str]:
    """run.py's arguments to finetune `params` with `setting` into `out` (mix_corpus: run.py --mix_corpus)."""
    finetune = ["finetune", *common_args(variant, seed), "--reading_params_path", str(params),
                "--writing_params_path", str(out), "--finetune_corpus_path", "birth_places_train.tsv",
                "--finetune_lr", str(setting["lr"]), "--dropout", str(setting["dropout"]),
                "--max_epochs", str(setting["epochs"]), "--batch_size", str(setting["batch"]),
                "--freeze_blocks", str(setting["frozen"]), "--optimizer", setting["optimizer"]]  # fmt: skip
    return finetune + (["--mix_corpus"] if mix_corpus else [])


def finetune_and_score(variant: str, params: Path, setting: dict, seed: int, work: Path, mix_corpus: bool) -> dict:
    """Finetune `params` with `setting`, evaluate on dev; returns seconds and accuracy."""
    run = [sys.executable, "src/run.py"]
    ft = work / "finetune.params"
    finetune = finetune_args(variant, params, setting, seed, ft, mix_corpus)
    evaluate = ["evaluate", *common_args(variant, seed), "--reading_params_path", str(ft),
                "--eval_corpus_path", "birth_dev.tsv", "--outputs_path", str(work / "dev.predictions")]  # fmt: skip
    ft_seconds, _ = timed(run + finetune, work / "finetune.log")
    _, text = timed(run + evaluate, work / "evaluate.log")
    correct, total = re.search(r"Correct: ([\d.]+) out of ([\d.]+)", text).groups()
    return {"finetune_seconds": round(ft_seconds, 1), "dev_accuracy": float(correct) / float(total)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variant", choices=["vanilla", "perceiver"], help="model variant of the params")
    p.add_argument("params", type=Path, help="pretrained params (run.py pretrain --writing_params_path)")
    p.add_argument("settings", nargs="+", help=f"finetuning settings, each {SETTING_FORM}")
    p.add_argument("--seeds", default="0", help="comma-separated finetuning seeds")
    p.add_argument(
        "--mix_corpus",
        action="store_true",
        help="every setting also trains on span-corruption examples of wiki.txt (run.py --mix_corpus)",
    )
    args = p.parse_args()
    settings = [parse_setting(s) for s in args.settings]
    for setting in settings:
        for seed in (int(s) for s in args.seeds.split(",")):
            with tempfile.TemporaryDirectory() as work:
                record = {
                    "params": str(args.params),
                    "variant": args.variant,
                    **setting,
                    "mix_corpus": args.mix_corpus,
                    "seed": seed,
                    "started": time.strftime("%Y-%m-%d %H:%M"),
                    **finetune_and_score(
                        args.variant, args.params.resolve(), setting, seed, Path(work), args.mix_corpus
                    ),  # fmt: skip
                }
            with open(RESULTS, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(
                f"lr {setting['lr']:g}, dropout {setting['dropout']:g}, {setting['epochs']} epochs, "
                f"batch {setting['batch']}, {setting['frozen']} blocks frozen, {setting['optimizer']}"
                f"{', corpus mixed in' if args.mix_corpus else ''}, seed {seed}: dev {record['dev_accuracy']:.1%} "
                f"(finetune {record['finetune_seconds']:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
