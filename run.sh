#!/usr/bin/env bash
# The whole birth-place experiment on a fresh machine, ending with bench/results/report.md:
#   the London baseline; finetuning without pretraining; then, for every variant, pretrain ->
#   finetune -> evaluate on dev and test; and the ensemble of the variants.
#
#   bash run.sh                                                      # the full run, about 2 hours
#   PRETRAIN_EPOCHS=2 FINETUNE_EPOCHS=1 NOPRETRAIN_EPOCHS=1 bash run.sh   # a smoke run of a few minutes
#
# Without a GPU the recipe is --preset cpu and the run is planned to TOTAL_MINUTES by measuring this
# machine: the steps that do not pretrain run first and are timed, and each pretraining gets an equal
# share of what is left (--budget_minutes), into which it plans its epochs after timing its first one.
# With a GPU the recipe is the handout's (minutes per variant there).
#
# Settings (environment): TOTAL_MINUTES (120), PRESET (cpu; handout with a GPU), VARIANTS
# ("vanilla perceiver rope"), SEED (0), PRETRAIN_EPOCHS, FINETUNE_EPOCHS (after pretraining),
# NOPRETRAIN_EPOCHS (finetune from scratch): the preset's when unset; OUT_DIR (outputs);
# EXTRA_FLAGS (added to every run.py call).
set -euo pipefail
cd "$(dirname "$0")"
source ./setup.sh

if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  : "${PRESET:=handout}"
else
  : "${PRESET:=cpu}"
fi
: "${TOTAL_MINUTES:=120}" "${VARIANTS:=vanilla perceiver rope}" "${SEED:=0}" "${OUT_DIR:=outputs}" "${EXTRA_FLAGS:=}"
mkdir -p "$OUT_DIR" expt
PRE_FLAGS="${PRETRAIN_EPOCHS:+--max_epochs $PRETRAIN_EPOCHS}"
FT_FLAGS="${FINETUNE_EPOCHS:+--max_epochs $FINETUNE_EPOCHS}"
NOPRE_FLAGS="${NOPRETRAIN_EPOCHS:+--max_epochs $NOPRETRAIN_EPOCHS}"
COMMON="--preset $PRESET --seed $SEED $EXTRA_FLAGS"
read -r -a VARIANT_LIST <<<"$VARIANTS"
START=$SECONDS
echo "run.sh: preset $PRESET, seed $SEED, variants: $VARIANTS; output in $OUT_DIR/"
if [ "$PRESET" = cpu ]; then
  echo "run.sh: planned to take about $TOTAL_MINUTES minutes on this machine: the steps without pretraining" \
    "are timed first, then each of the ${#VARIANT_LIST[@]} pretrainings gets an equal share of what is left"
fi

RUN="python src/run.py"
timed() {  # timed NAME command...: run it, log it, remember its wall-clock seconds
  local name=$1; shift
  local t0=$SECONDS
  echo; echo "== $name"
  # progress bars redraw with a carriage return: show the lines between them, not the bars
  "$@" 2>&1 | tee "$OUT_DIR/$name.log" | tr '\r' '\n' | grep --line-buffered -v -E '(it/s|s/it)[],]|^\s*$' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "run.sh: step $name failed; see $OUT_DIR/$name.log"; exit 1; }
  echo "$name $((SECONDS - t0))" >>"$OUT_DIR/times.txt"
}
seconds_of() { awk -v n="$1" '$1 == n {print $2}' "$OUT_DIR/times.txt"; }
: >"$OUT_DIR/times.txt"

timed london python london_baseline.py --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/london.dev.predictions"

timed vanilla_nopretrain_finetune $RUN finetune vanilla wiki.txt --writing_params_path "$OUT_DIR/vanilla.model.params" \
  --finetune_corpus_path birth_places_train.tsv $NOPRE_FLAGS $COMMON
timed vanilla_nopretrain_dev $RUN evaluate vanilla wiki.txt --reading_params_path "$OUT_DIR/vanilla.model.params" \
  --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/vanilla.nopretrain.dev.predictions" \
  --scores_path "$OUT_DIR/vanilla.nopretrain.dev.scores.tsv" $COMMON

BUDGET_FLAGS=""
if [ "$PRESET" = cpu ]; then
  # What a variant needs besides pretraining, from the steps just measured: a finetune of a pretrained
  # model (5 of the 75 epochs just run), two evaluations (twice the one just run), and a minute of margin.
  nopre=$(seconds_of vanilla_nopretrain_finetune) dev=$(seconds_of vanilla_nopretrain_dev)
  budget=$(python -c "import sys; total, used, nopre, dev, n = map(float, sys.argv[1:])
print(f'{max(1.0, (total * 60 - used - n * (nopre * 5 / 75 + 2 * dev + 60)) / n / 60):.1f}')" \
    "$TOTAL_MINUTES" "$((SECONDS - START))" "$nopre" "$dev" "${#VARIANT_LIST[@]}")
  BUDGET_FLAGS="--budget_minutes $budget"
  echo; echo "run.sh: $((SECONDS - START)) s so far; each pretraining gets $budget minutes"
fi

for variant in "${VARIANT_LIST[@]}"; do
  flags=""
  [ "$variant" = perceiver ] && flags="--bottleneck_dim 64"
  timed ${variant}_pretrain $RUN pretrain $variant wiki.txt --writing_params_path "$OUT_DIR/$variant.pretrain.params" \
    $PRE_FLAGS $BUDGET_FLAGS $flags $COMMON
  timed ${variant}_finetune $RUN finetune $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.pretrain.params" \
    --writing_params_path "$OUT_DIR/$variant.finetune.params" --finetune_corpus_path birth_places_train.tsv \
    $FT_FLAGS $flags $COMMON
  timed ${variant}_pretrain_dev $RUN evaluate $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.finetune.params" \
    --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/$variant.pretrain.dev.predictions" \
    --scores_path "$OUT_DIR/$variant.pretrain.dev.scores.tsv" $flags $COMMON
  timed ${variant}_pretrain_test $RUN evaluate $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.finetune.params" \
    --eval_corpus_path birth_test_inputs.tsv --outputs_path "$OUT_DIR/$variant.pretrain.test.predictions" $flags $COMMON
done

if [ "${#VARIANT_LIST[@]}" -gt 1 ]; then  # each question answered by the variant most confident of its answer
  first=${VARIANT_LIST[0]} others=()
  for variant in "${VARIANT_LIST[@]:1}"; do others+=("$OUT_DIR/$variant.finetune.params"); done
  timed ensemble_dev $RUN evaluate $first wiki.txt --reading_params_path "$OUT_DIR/$first.finetune.params" \
    --ensemble_params "${others[@]}" --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/ensemble.dev.predictions" \
    --scores_path "$OUT_DIR/ensemble.dev.scores.tsv" $COMMON
fi

echo; echo "run.sh: done in $(((SECONDS - START) / 60)) minutes"
# A full run is recorded (bench/results/report.md and runs.jsonl, the README's table); a shortened one is not.
REPORT=(--out "$OUT_DIR/report.md")
if [ -z "${PRETRAIN_EPOCHS:-}${FINETUNE_EPOCHS:-}${NOPRETRAIN_EPOCHS:-}${EXTRA_FLAGS}" ] && [ "$VARIANTS" = "vanilla perceiver rope" ]; then
  REPORT=(--record)
fi
python bench/report.py --runs "$OUT_DIR" --preset "$PRESET" --seed "$SEED" --command "bash run.sh" "${REPORT[@]}"
echo "Predictions, params and logs: $OUT_DIR/; TensorBoard: tensorboard --logdir expt"
