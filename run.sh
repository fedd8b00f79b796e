#!/usr/bin/env bash
# The whole birth-place experiment on a fresh machine, ending with a results table:
#   London baseline; finetune without pretraining; pretrain -> finetune for vanilla
#   and perceiver; dev accuracy and test predictions for each.
#
#   bash run.sh                                   # full run (see the README for times)
#   PRETRAIN_EPOCHS=2 FINETUNE_EPOCHS=1 NOPRETRAIN_EPOCHS=1 bash run.sh   # a quick smoke run
#
# Settings (environment): PRETRAIN_EPOCHS, FINETUNE_EPOCHS (after pretraining),
# NOPRETRAIN_EPOCHS (finetune from scratch), PRETRAIN_LR (perceiver), OUT_DIR (outputs/),
# EXTRA_FLAGS (passed to every run.py call, e.g. "--device cuda").
set -euo pipefail
cd "$(dirname "$0")"
source ./setup.sh

if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  DEVICE=gpu
  : "${PRETRAIN_EPOCHS:=650}" "${FINETUNE_EPOCHS:=10}" "${NOPRETRAIN_EPOCHS:=75}"
else
  DEVICE=cpu
  # The handout's 650 epochs take about a day on a 2-core CPU; default to a short run.
  : "${PRETRAIN_EPOCHS:=20}" "${FINETUNE_EPOCHS:=10}" "${NOPRETRAIN_EPOCHS:=75}"
fi
: "${OUT_DIR:=outputs}" "${EXTRA_FLAGS:=}" "${PERCEIVER_PRETRAIN_LR:=6e-3}"
mkdir -p "$OUT_DIR" expt

# Seconds per epoch on the 2-core reference CPU (bench/results), for the estimate below.
estimate=$(python - "$PRETRAIN_EPOCHS" "$FINETUNE_EPOCHS" "$NOPRETRAIN_EPOCHS" "$DEVICE" <<'PY'
import sys
pre, ft, nopre, device = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
per_epoch = {"pretrain_vanilla": 29, "pretrain_perceiver": 17, "finetune": 5.5, "evaluate": 6}
s = pre * (per_epoch["pretrain_vanilla"] + per_epoch["pretrain_perceiver"])
s += (2 * ft + nopre) * per_epoch["finetune"] + 5 * per_epoch["evaluate"]
print(f"about {s / 60:.0f} minutes on a 2-core CPU" if device == "cpu" else "minutes on a GPU")
PY
)
echo "run.sh: device $DEVICE; pretrain $PRETRAIN_EPOCHS epochs, finetune $FINETUNE_EPOCHS epochs" \
  "(from scratch: $NOPRETRAIN_EPOCHS); expected time: $estimate"

RUN="python src/run.py"
timed() {  # timed NAME command...: run, remember wall-clock seconds
  local name=$1; shift
  local t0=$SECONDS
  echo; echo "== $name"
  "$@" 2>&1 | tee "$OUT_DIR/$name.log" | grep -v -E '^\s*$' | grep -v $'\r' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "run.sh: step $name failed; see $OUT_DIR/$name.log"; exit 1; }
  echo "$name $((SECONDS - t0))" >>"$OUT_DIR/times.txt"
}
: >"$OUT_DIR/times.txt"

timed london python london_baseline.py --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/london.dev.predictions"

timed vanilla_nopretrain_finetune $RUN finetune vanilla wiki.txt --writing_params_path "$OUT_DIR/vanilla.model.params" \
  --finetune_corpus_path birth_places_train.tsv --max_epochs "$NOPRETRAIN_EPOCHS" $EXTRA_FLAGS
timed vanilla_nopretrain_dev $RUN evaluate vanilla wiki.txt --reading_params_path "$OUT_DIR/vanilla.model.params" \
  --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/vanilla.nopretrain.dev.predictions" $EXTRA_FLAGS

for variant in vanilla perceiver; do
  flags=""
  [ "$variant" = perceiver ] && flags="--bottleneck_dim 64 --pretrain_lr $PERCEIVER_PRETRAIN_LR"
  timed ${variant}_pretrain $RUN pretrain $variant wiki.txt --writing_params_path "$OUT_DIR/$variant.pretrain.params" \
    --max_epochs "$PRETRAIN_EPOCHS" $flags $EXTRA_FLAGS
  timed ${variant}_finetune $RUN finetune $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.pretrain.params" \
    --writing_params_path "$OUT_DIR/$variant.finetune.params" --finetune_corpus_path birth_places_train.tsv \
    --max_epochs "$FINETUNE_EPOCHS" $flags $EXTRA_FLAGS
  timed ${variant}_pretrain_dev $RUN evaluate $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.finetune.params" \
    --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/$variant.pretrain.dev.predictions" $flags $EXTRA_FLAGS
  timed ${variant}_pretrain_test $RUN evaluate $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.finetune.params" \
    --eval_corpus_path birth_test_inputs.tsv --outputs_path "$OUT_DIR/$variant.pretrain.test.predictions" $flags $EXTRA_FLAGS
done

python - "$OUT_DIR" "$PRETRAIN_EPOCHS" "$FINETUNE_EPOCHS" "$NOPRETRAIN_EPOCHS" <<'PY' | tee "$OUT_DIR/results.md"
import re, sys
from pathlib import Path
out, pre, ft, nopre = Path(sys.argv[1]), *sys.argv[2:]
times = dict(line.split() for line in (out / "times.txt").read_text().splitlines())
def acc(name):
    m = re.search(r"Correct: .*: ([\d.]+)%", (out / f"{name}.log").read_text())
    return f"{float(m.group(1)):.1f}%" if m else "?"
rows = [
    ("London baseline", "-", acc("london"), times["london"]),
    (f"vanilla, no pretraining ({nopre} ep.)", times["vanilla_nopretrain_finetune"], acc("vanilla_nopretrain_dev"), "-"),
    (f"vanilla, pretrain {pre} ep. + finetune {ft} ep.",
     f'{times["vanilla_pretrain"]} + {times["vanilla_finetune"]}', acc("vanilla_pretrain_dev"), "-"),
    (f"perceiver (m=64), pretrain {pre} ep. + finetune {ft} ep.",
     f'{times["perceiver_pretrain"]} + {times["perceiver_finetune"]}', acc("perceiver_pretrain_dev"), "-"),
]
print("\n| model | train seconds | dev accuracy | baseline seconds |\n|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(map(str, r)) + " |")
print(f"\nPredictions, params and logs are in {out}/; TensorBoard: tensorboard --logdir expt")
PY
