#!/usr/bin/env bash
# The whole birth-place experiment on a fresh machine, ending with a results table:
#   London baseline; finetune without pretraining; pretrain -> finetune for vanilla
#   and perceiver; dev accuracy and test predictions for each.
#
#   bash run.sh                                   # full run (see the README for times)
#   PRETRAIN_EPOCHS=2 FINETUNE_EPOCHS=1 NOPRETRAIN_EPOCHS=1 bash run.sh   # a quick smoke run
#
# Settings (environment): PRESET (handout with a GPU; without one cpu where the CPU has AMX,
# cpu_fp32 elsewhere: in fp32 where the CPU has no native bf16 matmuls, under bf16 autocast with
# 100 vanilla and 150 perceiver epochs where it has AVX512-BF16 but no AMX), PRETRAIN_EPOCHS,
# FINETUNE_EPOCHS (after pretraining), NOPRETRAIN_EPOCHS (finetune from scratch): the
# preset's when unset; PRETRAIN_BUDGET_MINUTES (each pretraining's --budget_minutes: 115 with
# the cpu presets, so that pretrain + finetune + evaluate of one variant fit in two hours on a
# CPU slower than the one the preset was tuned on; none otherwise; "none" turns it off; with
# cpu_fp32 and no PRETRAIN_EPOCHS the epochs are planned to fill it, --budget_fit);
# OUT_DIR (outputs/); EXTRA_FLAGS (added to every run.py call).
set -euo pipefail
cd "$(dirname "$0")"
source ./setup.sh

if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  DEVICE=gpu; : "${PRESET:=handout}"
else
  DEVICE=cpu  # the handout's 650 epochs take many hours on a small CPU
  CPU_KIND=$(python -c "import sys, torch; sys.path.insert(0, 'src'); from utils import bf16_supported, cpu_info
bf16 = bf16_supported(torch.device('cpu'))
print('amx' if bf16 and 'amx_bf16' in cpu_info().get('flags', '').split() else 'bf16' if bf16 else 'fp32')")
  case "$CPU_KIND" in
    amx) : "${PRESET:=cpu}" ;;  # the CPU the cpu preset was tuned on, where it met the targets
    bf16)  # AVX512-BF16 without AMX (issue 3's EPYC): Muon under bf16 autocast beat cpu there (README)
      if [ -z "${PRESET:-}" ]; then PRESET=cpu_fp32; MEASURED_PLAN=yes; fi ;;
    *) : "${PRESET:=cpu_fp32}" ;;  # fp32 steps are 2-5x slower: Muon stores more per epoch (README)
  esac
fi
: "${OUT_DIR:=outputs}" "${EXTRA_FLAGS:=}"
mkdir -p "$OUT_DIR" expt
# Epoch counts: the preset's unless set in the environment.
PRE_FLAGS=""; FT_FLAGS=""; NOPRE_FLAGS=""
VANILLA_EPOCHS="${PRETRAIN_EPOCHS:-}"; PERCEIVER_EPOCHS="${PRETRAIN_EPOCHS:-}"
# On the AVX512-BF16 EPYC cpu_fp32 runs an epoch in about 27 s (vanilla) and 24 s (perceiver):
# pretrain for the epochs measured there (README, "A CPU recipe") rather than the ~230 that
# --budget_fit would plan, which are untested.
if [ "${MEASURED_PLAN:-no}" = yes ] && [ -z "${PRETRAIN_EPOCHS:-}" ]; then
  VANILLA_EPOCHS=100; PERCEIVER_EPOCHS=150
fi
[ -n "${FINETUNE_EPOCHS:-}" ] && FT_FLAGS="--max_epochs $FINETUNE_EPOCHS"
[ -n "${NOPRETRAIN_EPOCHS:-}" ] && NOPRE_FLAGS="--max_epochs $NOPRETRAIN_EPOCHS"
case "$PRESET" in cpu | cpu_fp32) : "${PRETRAIN_BUDGET_MINUTES:=115}" ;; esac
BUDGET="${PRETRAIN_BUDGET_MINUTES:-none}"
[ "$BUDGET" != none ] && PRE_FLAGS="$PRE_FLAGS --budget_minutes $BUDGET"
# cpu_fp32's 60 epochs fill two hours on the slowest CPU seen (a Zen 1); a faster CPU without bf16
# has time for more, and more epochs store more facts (README, "A time budget"): plan to the budget.
FIT=no
if [ "$PRESET" = cpu_fp32 ] && [ "$BUDGET" != none ] && [ -z "$VANILLA_EPOCHS" ]; then
  FIT=yes; PRE_FLAGS="$PRE_FLAGS --budget_fit"
fi

estimate=$(python - "$PRESET" "$DEVICE" "$BUDGET" "$FIT" "$VANILLA_EPOCHS" "$PERCEIVER_EPOCHS" "${FINETUNE_EPOCHS:-}" "${NOPRETRAIN_EPOCHS:-}" <<'PY'
import sys
sys.path.insert(0, "src")
from run import PRESETS
from trainer import BUDGET_FIT_SHARE
from utils import cpu_info
preset, device, budget, fit, *epochs = sys.argv[1:]
pre = [int(e or PRESETS[preset]["pretrain"]["max_epochs"]) for e in epochs[:2]]  # vanilla, perceiver
ft = int(epochs[2] or PRESETS[preset]["finetune_pretrained"]["max_epochs"])
nopre = int(epochs[3] or 75)
# Seconds per pretraining epoch (vanilla, perceiver) and per finetuning epoch, measured on three
# 2-core CPUs (README, "Speed"): the Xeon with AMX the preset was tuned on (cpu: the runs in
# bench/results/time_to_accuracy.jsonl; handout: bench/results/speed.json), an AMD EPYC with
# AVX512-BF16 (about 2x slower) and an AMD EPYC with AVX2 only, where the fast path runs in fp32
# (about 5x slower; a first-generation Zen, AMD family 23 below model 48, about 9x). A CPU
# slower than the Xeon is held to the budget instead.
info = cpu_info()
flags, family, model = info.get("flags", "").split(), info.get("cpu family", ""), info.get("model", "")
if "amx_bf16" in flags:
    cpu, scale, ft_epoch = "a CPU with AMX, like the 2-core Xeon the preset was tuned on", 1.0, 5.2
elif "avx512_bf16" in flags:
    cpu, scale, ft_epoch = "a CPU with AVX512-BF16 and no AMX (the 2-core EPYC: about 2x the Xeon)", 2.0, 8.4
elif info.get("vendor_id") == "AuthenticAMD" and family == "23" and model.isdigit() and int(model) < 48:
    cpu, scale, ft_epoch = "a first-generation Zen CPU, fp32 (the 2-core Zen 1 EPYC: about 9x the Xeon)", 8.6, 37.0
else:
    cpu, scale, ft_epoch = "a CPU without bf16 matmuls, so fp32 (the 2-core AVX2 EPYC: about 5x the Xeon)", 5.0, 17.4
# cpu_fp32 (batch 32, Muon) in the Xeon's units: 93 s per vanilla epoch (the mean of three 60-epoch
# runs, 89-100 s, sessions 22-24) and 83 s per perceiver epoch (session 25's 60-epoch run), on the
# Zen 1 (bench/results/time_to_accuracy.jsonl).
per_epoch = {"handout": (13, 13), "cpu": (9.6, 7.7), "cpu_fp32": (93 / 8.6, 83 / 8.6)}[preset]
pretrain = [n * e * scale for n, e in zip(pre, per_epoch)]
if preset == "cpu_fp32" and "avx512_bf16" in flags and "amx_bf16" not in flags:
    pretrain = [n * e for n, e in zip(pre, (27, 24))]  # under bf16 autocast, sessions 33-34
if budget != "none":
    pretrain = [min(p, float(budget) * 60) for p in pretrain]
if fit == "yes":  # --budget_fit: as many epochs as the budget holds, however fast the CPU
    pretrain = [BUDGET_FIT_SHARE * float(budget) * 60 for p in pretrain]
s = sum(pretrain) + (2 * ft + nopre) * ft_epoch + 5 * 30
held = f"; each pretraining stops after {budget} minutes" if budget != "none" else ""
if fit == "yes":
    held = f"; each pretraining plans its epochs to fill {BUDGET_FIT_SHARE:.0%} of {budget} minutes"
print(f"about {s / 60:.0f} minutes on {cpu}{held}" if device == "cpu" else "well under the CPU time on a GPU")
PY
)
echo "run.sh: device $DEVICE, preset $PRESET; pretrain ${VANILLA_EPOCHS:-preset} epochs (vanilla)" \
  "and ${PERCEIVER_EPOCHS:-preset} (perceiver) (budget: $BUDGET minutes)," \
  "finetune ${FINETUNE_EPOCHS:-preset} epochs (from scratch: ${NOPRETRAIN_EPOCHS:-75}); expected time: $estimate" \
  "(a guess from the CPU's kind; each training step prints a projection measured on its first epoch)"

RUN="python src/run.py"
timed() {  # timed NAME command...: run it, log it, remember its wall-clock seconds
  local name=$1; shift
  local t0=$SECONDS
  echo; echo "== $name"
  "$@" 2>&1 | tee "$OUT_DIR/$name.log" | grep -v $'\r' | grep -v -E '^\s*$' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "run.sh: step $name failed; see $OUT_DIR/$name.log"; exit 1; }
  echo "$name $((SECONDS - t0))" >>"$OUT_DIR/times.txt"
}
: >"$OUT_DIR/times.txt"
COMMON="--preset $PRESET $EXTRA_FLAGS"

timed london python london_baseline.py --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/london.dev.predictions"

timed vanilla_nopretrain_finetune $RUN finetune vanilla wiki.txt --writing_params_path "$OUT_DIR/vanilla.model.params" \
  --finetune_corpus_path birth_places_train.tsv $NOPRE_FLAGS $COMMON
timed vanilla_nopretrain_dev $RUN evaluate vanilla wiki.txt --reading_params_path "$OUT_DIR/vanilla.model.params" \
  --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/vanilla.nopretrain.dev.predictions" \
  --scores_path "$OUT_DIR/vanilla.nopretrain.dev.scores.tsv" $COMMON

for variant in vanilla perceiver; do
  flags="" epochs="$VANILLA_EPOCHS"
  [ "$variant" = perceiver ] && flags="--bottleneck_dim 64" && epochs="$PERCEIVER_EPOCHS"
  timed ${variant}_pretrain $RUN pretrain $variant wiki.txt --writing_params_path "$OUT_DIR/$variant.pretrain.params" \
    ${epochs:+--max_epochs $epochs} $PRE_FLAGS $flags $COMMON
  timed ${variant}_finetune $RUN finetune $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.pretrain.params" \
    --writing_params_path "$OUT_DIR/$variant.finetune.params" --finetune_corpus_path birth_places_train.tsv \
    $FT_FLAGS $flags $COMMON
  timed ${variant}_pretrain_dev $RUN evaluate $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.finetune.params" \
    --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/$variant.pretrain.dev.predictions" \
    --scores_path "$OUT_DIR/$variant.pretrain.dev.scores.tsv" $flags $COMMON
  timed ${variant}_pretrain_test $RUN evaluate $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.finetune.params" \
    --eval_corpus_path birth_test_inputs.tsv --outputs_path "$OUT_DIR/$variant.pretrain.test.predictions" $flags $COMMON
done

python bench/report.py --runs "$OUT_DIR" --out "$OUT_DIR/report.md"
echo "Predictions, params and logs: $OUT_DIR/; TensorBoard: tensorboard --logdir expt"
