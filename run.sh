#!/usr/bin/env bash
# The whole birth-place experiment on a fresh machine, ending with a report in OUT_DIR/report.md:
#   the London baseline; finetuning without pretraining; then, for every variant, pretrain ->
#   finetune -> evaluate on dev and test (the direct protocol), and a recite reader finetuned from
#   the same pretrained params -> evaluate on dev and test (the recite protocol, src/recite.py).
#
#   bash run.sh                                                      # the full run, about 2 hours
#   PRETRAIN_EPOCHS=2 FINETUNE_EPOCHS=1 NOPRETRAIN_EPOCHS=1 bash run.sh   # a smoke run of a few minutes
#
# Without a GPU the recipe is --preset cpu and the run is planned to TOTAL_MINUTES by measuring this
# machine (config.plan_run): the finetune without pretraining (a control) runs first, planned to 5% of it;
# its pace and its dev evaluation's time then plan every other step, said one a line before they run:
# the pretrainings get at least 60% (--budget_minutes, into which each plans its epochs at the pace it
# measures), the readers' epochs fill what the finetunes and evaluations leave. With a GPU the recipe is
# the handout's; once the first variant is done, the run says how long the rest takes.
#
#   PLAN_ONLY=1 QUESTION_EPOCH_SECONDS=41.2 DEV_SECONDS=15 bash run.sh   # the plan alone, for a machine
#       whose epoch of finetune questions takes 41.2 s and a dev evaluation 15 s; nothing runs
#
# Settings (environment): TOTAL_MINUTES (120), PRESET (cpu; handout with a GPU), VARIANTS
# ("vanilla perceiver rope" when unset; words on any whitespace), SEED (0), PRETRAIN_EPOCHS,
# FINETUNE_EPOCHS (after pretraining), NOPRETRAIN_EPOCHS (finetune from scratch): the preset's when
# unset; OUT_DIR (outputs; not a folder holding files git tracks); EXTRA_FLAGS (run.py flags, each given to
# the steps whose command takes it; not the seed, preset, epochs, budgets or files: run.sh sets those); RECORD (0; 1: record the run in bench/results/,
# report.md and runs.jsonl, the README's table: for the project's own measured runs, full runs only);
# PLAN_ONLY (0; 1: say the plan for QUESTION_EPOCH_SECONDS and DEV_SECONDS, then stop).
# Settings are checked before anything runs (one line each, exit 2); the first failed step stops the
# run, naming the step and its log, and no report is written.
set -euo pipefail
cd "$(dirname "$(realpath "$0")")"  # the checkout's, also when run.sh is reached through a symlink

VARIANTS=${VARIANTS-vanilla perceiver rope}  # only an unset VARIANTS means all three; an empty one is refused
: "${TOTAL_MINUTES:=120}" "${SEED:=0}" "${OUT_DIR:=outputs}" "${EXTRA_FLAGS:=}"
case $OUT_DIR in -*) OUT_DIR="./$OUT_DIR" ;; esac  # a folder named like a flag: no command may take it for one
: "${RECORD:=0}" "${PRESET:=}" "${PRETRAIN_EPOCHS:=}" "${FINETUNE_EPOCHS:=}" "${NOPRETRAIN_EPOCHS:=}"
: "${PLAN_ONLY:=0}" "${QUESTION_EPOCH_SECONDS:=}" "${DEV_SECONDS:=}"
# Words on any whitespace (spaces, tabs, newlines), as the unquoted $EXTRA_FLAGS is split in every step.
read -r -d '' -a VARIANT_LIST <<<"$VARIANTS" || true
read -r -d '' -a EXTRA_LIST <<<"$EXTRA_FLAGS" || true
bad=()
[ "${#VARIANT_LIST[@]}" -gt 0 ] ||
  bad+=("VARIANTS is empty; give some of: vanilla perceiver rope (or unset it for all three)")
seen=" "
for variant in "${VARIANT_LIST[@]}"; do
  case $variant in
    vanilla | perceiver | rope) ;;
    *) bad+=("VARIANTS: unknown variant '$variant'; choose from: vanilla perceiver rope") ;;
  esac
  [[ $seen == *" $variant "* ]] && bad+=("VARIANTS: $variant is named twice")
  seen+="$variant "
done
# at most 10 digits, so that bash's arithmetic cannot overflow; 10# reads leading zeros as decimal
[[ $SEED =~ ^[0-9]{1,10}$ ]] && ((10#$SEED < 2 ** 32)) ||
  bad+=("SEED must be an integer from 0 to $((2 ** 32 - 1)), got '$SEED'")
positive() { [[ $1 =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ && $1 =~ [1-9] ]]; }
positive "$TOTAL_MINUTES" || bad+=("TOTAL_MINUTES must be a positive number of minutes, got '$TOTAL_MINUTES'")
case $PLAN_ONLY in
  0) [ -z "$QUESTION_EPOCH_SECONDS$DEV_SECONDS" ] ||
    bad+=("QUESTION_EPOCH_SECONDS and DEV_SECONDS are for PLAN_ONLY=1 (a run measures them)") ;;
  1) for name in QUESTION_EPOCH_SECONDS DEV_SECONDS; do
    positive "${!name}" || bad+=("PLAN_ONLY=1 needs $name, a positive number of seconds, got '${!name}'")
  done ;;
  *) bad+=("PLAN_ONLY must be 0 or 1, got '$PLAN_ONLY'") ;;
esac
for name in PRETRAIN_EPOCHS FINETUNE_EPOCHS NOPRETRAIN_EPOCHS; do
  value=${!name}
  [ -z "$value" ] || [[ $value =~ ^[0-9]+$ && $value =~ [1-9] ]] ||
    bad+=("$name must be a positive integer, got '$value'")
done
case $PRESET in "" | handout | cpu) ;; *) bad+=("PRESET must be handout or cpu, got '$PRESET'") ;; esac
# A run's outputs must not replace files git tracks (such as the recorded bench/results/report.md).
[ ! -e "$OUT_DIR" ] || [ -d "$OUT_DIR" ] || bad+=("OUT_DIR '$OUT_DIR' is not a folder; give a folder name")
[ -e "$OUT_DIR" ] || [ ! -L "$OUT_DIR" ] || bad+=("OUT_DIR '$OUT_DIR' is a symlink that cannot be followed")
IFS=/ read -r -a parts <<<"$OUT_DIR"
for part in "${parts[@]}"; do
  [ "$(printf %s "$part" | wc -c)" -le 255 ] || { bad+=("OUT_DIR '${OUT_DIR:0:60}...': a name too long for the file system"); break; }
done
[ "$(printf %s "$OUT_DIR" | wc -c)" -lt 4096 ] || bad+=("OUT_DIR '${OUT_DIR:0:60}...': a path too long for the file system")
above=$OUT_DIR  # the folder mkdir -p would make it in: its nearest existing part must be a writable folder
while [ ! -e "$above" ] && [ "$above" != "$(dirname -- "$above")" ]; do above=$(dirname -- "$above"); done
if [ ! -d "$above" ]; then
  [ "$above" = "$OUT_DIR" ] || bad+=("OUT_DIR '$OUT_DIR' lies inside '$above', which is not a folder; give a folder name")
elif [ ! -w "$above" ] || [ ! -x "$above" ]; then
  bad+=("OUT_DIR '$OUT_DIR': '$above' is not writable; give another folder")
fi
out_path=$(realpath -m -- "$OUT_DIR" 2>/dev/null || echo "$OUT_DIR")  # through symlinks, as git sees it
tracked=$(git --literal-pathspecs ls-files -- "$out_path" 2>/dev/null | head -n 1) || true
[ -z "$tracked" ] || bad+=("OUT_DIR '$OUT_DIR' holds files tracked by git ($tracked); choose another folder, e.g. outputs")
git_dir=$(git rev-parse --absolute-git-dir 2>/dev/null) || git_dir=""
case $out_path/ in "${git_dir:-/nowhere}"/*) bad+=("OUT_DIR '$OUT_DIR' is inside git's own folder; choose another, e.g. outputs") ;; esac
case $RECORD in
  0) ;;
  1) [ -z "$PRETRAIN_EPOCHS$FINETUNE_EPOCHS$NOPRETRAIN_EPOCHS$EXTRA_FLAGS" ] || bad+=("RECORD=1 records full runs \
only: unset PRETRAIN_EPOCHS, FINETUNE_EPOCHS, NOPRETRAIN_EPOCHS and EXTRA_FLAGS") ;;
  *) bad+=("RECORD must be 0 or 1, got '$RECORD'") ;;
esac
if [ "${#bad[@]}" -gt 0 ]; then
  printf 'run.sh: %s\n' "${bad[@]}" >&2
  exit 2
fi
VARIANTS="${VARIANT_LIST[*]}" SEED=$((10#$SEED))  # as the steps read them: one space between variants, no leading 0

source ./setup.sh
if [ -z "$PRESET" ]; then
  PRESET=cpu
  if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then PRESET=handout; fi
fi
# EXTRA_FLAGS go to the run.py commands that take them, checked by each command's rules before any step runs
# (run.py's extra_flags): a line of flags for pretrain, one for finetune, one for evaluate.
extra=$(python -c 'import sys; sys.path.insert(0, "src"); import run; sys.exit(run.print_extra_flags(sys.argv[1:]))' \
  "$PRESET" "$VARIANTS" "${EXTRA_LIST[@]}") || exit 2
mapfile -t extra <<<"$extra"
PRETRAIN_EXTRA=${extra[0]:-} FINETUNE_EXTRA=${extra[1]:-} EVALUATE_EXTRA=${extra[2]:-}
BOTTLENECK=64  # the perceiver's m: its bottleneck's positions
# say_plan EPOCH_SECONDS DEV_SECONDS [CONTROL_SECONDS]: say the plan (config.plan_run), then set BUDGET (each
# pretraining's minutes), READER_EPOCHS and PLANNED_MINUTES from it
say_plan() {
  local plan
  plan=$(python -c "import sys; sys.path.insert(0, 'src'); import config
total, epoch, dev = map(float, sys.argv[1:4])
control = float(sys.argv[4]) if sys.argv[4] else None
epochs = [int(n) if n else None for n in sys.argv[7:9]]
plan = config.plan_run(total, epoch, dev, sys.argv[5].split(), int(sys.argv[6]), control, *epochs)
print(f'run.sh: the plan for TOTAL_MINUTES={total:g}, at {epoch:.1f} s an epoch of questions, {dev:.1f} s a dev evaluation:')
print(*plan.lines(total), sep='\n')
variant = sys.argv[5].split()[0]
print(round(plan.minutes[variant + '_pretrain'], 2), plan.epochs[variant + '_reader'], round(sum(plan.minutes.values())))" \
    "$TOTAL_MINUTES" "$1" "$2" "${3:-}" "$VARIANTS" "$BOTTLENECK" "$NOPRETRAIN_EPOCHS" "$FINETUNE_EPOCHS")
  printf '%s\n' "${plan%$'\n'*}"
  read -r BUDGET READER_EPOCHS PLANNED_MINUTES <<<"${plan##*$'\n'}"
}
if [ "$PLAN_ONLY" = 1 ]; then
  [ "$PRESET" = cpu ] || { echo "run.sh: PLAN_ONLY=1 plans the cpu preset; the handout's recipe has no plan" >&2; exit 2; }
  say_plan "$QUESTION_EPOCH_SECONDS" "$DEV_SECONDS"
  exit 0
fi
mkdir -p -- "$OUT_DIR" expt 2>/dev/null || { echo "run.sh: OUT_DIR '$OUT_DIR' cannot be made here" >&2; exit 2; }
PRE_FLAGS="${PRETRAIN_EPOCHS:+--max_epochs $PRETRAIN_EPOCHS}"
FT_FLAGS="${FINETUNE_EPOCHS:+--max_epochs $FINETUNE_EPOCHS}"
NOPRE_FLAGS="${NOPRETRAIN_EPOCHS:+--max_epochs $NOPRETRAIN_EPOCHS}"
# One TensorBoard folder per run.sh, holding a folder per step named after what it did (run.py's run_role).
TB_DIR="expt/run.sh_$(date +%Y%m%d-%H%M%S)_seed$SEED"
COMMON="--preset $PRESET --seed $SEED --tb_dir $TB_DIR"
START=$SECONDS STEP=0
STEPS=$((3 + 7 * ${#VARIANT_LIST[@]}))  # london, from scratch (2), 7 per variant
echo "run.sh: preset $PRESET, seed $SEED, variants: $VARIANTS; output in $OUT_DIR/"
CONTROL_FLAGS=$NOPRE_FLAGS
if [ "$PRESET" = cpu ]; then
  control_minutes=$(python -c "import sys; sys.path.insert(0, 'src'); import config
print(f'{config.CONTROL_SHARE * float(sys.argv[1]):.2f}')" "$TOTAL_MINUTES")
  echo "run.sh: planned to take about $TOTAL_MINUTES minutes on this machine: the finetune without pretraining" \
    "is planned to $control_minutes of them; its pace then plans every other step, most of the time going to" \
    "the ${#VARIANT_LIST[@]} pretrainings"
  CONTROL_FLAGS="$NOPRE_FLAGS --budget_minutes $control_minutes"
fi

RUN="python src/run.py"
# A kill or a closed terminal stops the step running too (a training writes its checkpoint), then run.sh. The steps
# run in the background, waited for: bash runs a trap only once the foreground command has ended.
stop_run() {
  trap - TERM HUP
  kill -TERM $(jobs -p) 2>/dev/null || true
  wait || true
  echo "run.sh: stopped by a signal during step ${STEP_NAME:-}; its log is in $OUT_DIR/" >&2
  exit 143
}
trap stop_run TERM HUP
timed() {  # timed NAME command...: run it, log it, remember its wall-clock seconds; stop the run if it fails
  local name=$1; shift
  local t0=$SECONDS status=0
  echo; echo "== $name"
  STEP_NAME=$name
  # Progress bars redraw with a carriage return: show the lines between them, not the bars. grep finding
  # no line is no failure; with pipefail the pipeline's status is then the command's (or tee's).
  "$@" 2>&1 | tee "$OUT_DIR/$name.log" | tr '\r' '\n' |
    { grep --line-buffered -v -E '(it/s|s/it)[],]|^\s*$' || true; } &
  wait $! || status=$?
  if [ "$status" -ne 0 ]; then
    echo "run.sh: step $name failed (exit code $status); see $OUT_DIR/$name.log" >&2
    exit "$status"
  fi
  echo "$name $((SECONDS - t0))" >>"$OUT_DIR/times.txt"
  STEP=$((STEP + 1))
  local left="" elapsed=$((SECONDS - START))
  if [ -n "${PLANNED_MINUTES:-}" ]; then left=$(awk -v p="$PLANNED_MINUTES" -v e="$elapsed" \
    'BEGIN { l = p - e / 60; if (l > 0) printf ", about %.0f min left of the plan", l }'); fi
  echo "run.sh: step $STEP of $STEPS done ($name, $((SECONDS - t0)) s); $((elapsed / 60)) min so far$left"
}
seconds_of() { awk -v n="$1" '$1 == n {print $2}' "$OUT_DIR/times.txt"; }
: >"$OUT_DIR/times.txt"

timed london python london_baseline.py --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/london.dev.predictions"

timed vanilla_nopretrain_finetune $RUN finetune vanilla wiki.txt --writing_params_path "$OUT_DIR/vanilla.model.params" \
  --finetune_corpus_path birth_places_train.tsv $CONTROL_FLAGS $COMMON $FINETUNE_EXTRA
timed vanilla_nopretrain_dev $RUN evaluate vanilla wiki.txt --reading_params_path "$OUT_DIR/vanilla.model.params" \
  --eval_corpus_path birth_dev.tsv --outputs_path "$OUT_DIR/vanilla.nopretrain.dev.predictions" \
  --scores_path "$OUT_DIR/vanilla.nopretrain.dev.scores.tsv" $COMMON $EVALUATE_EXTRA

BUDGET_FLAGS="" READER_FLAGS=$FT_FLAGS
if [ "$PRESET" = cpu ]; then
  # The control's pace (its sidecar: training seconds over epochs) and its dev evaluation's time plan the rest.
  epoch=$(python -c "import sys; sys.path.insert(0, 'src'); import params
record = params.read_sidecar(sys.argv[1])
print(record['train_seconds'] / record['epochs_done'])" "$OUT_DIR/vanilla.model.params")
  echo
  say_plan "$epoch" "$(seconds_of vanilla_nopretrain_dev)" "$(seconds_of vanilla_nopretrain_finetune)"
  BUDGET_FLAGS="--budget_minutes $BUDGET"
  [ -n "$FINETUNE_EPOCHS" ] || READER_FLAGS="--max_epochs $READER_EPOCHS"
fi

# answer_with STEP PARAMS PREDICTIONS [FLAGS]: finetune $variant's pretrained params (step ${variant}_STEP) into
# $variant.PARAMS.params, then answer dev (with scores) and test into $variant.PREDICTIONS.{dev,test}.predictions
answer_with() {
  local step=$1 params="$OUT_DIR/$variant.$2.params" out="$OUT_DIR/$variant.$3" name=${variant}_$3; shift 3
  timed ${variant}_$step $RUN finetune $variant wiki.txt --reading_params_path "$OUT_DIR/$variant.pretrain.params" \
    --writing_params_path "$params" --finetune_corpus_path birth_places_train.tsv "$@" $flags $COMMON $FINETUNE_EXTRA
  timed ${name}_dev $RUN evaluate $variant wiki.txt --reading_params_path "$params" --eval_corpus_path birth_dev.tsv \
    --outputs_path "$out.dev.predictions" --scores_path "$out.dev.scores.tsv" $flags $COMMON $EVALUATE_EXTRA
  timed ${name}_test $RUN evaluate $variant wiki.txt --reading_params_path "$params" \
    --eval_corpus_path birth_test_inputs.tsv --outputs_path "$out.test.predictions" $flags $COMMON $EVALUATE_EXTRA
}

for variant in "${VARIANT_LIST[@]}"; do
  flags="" cycle_start=$SECONDS
  [ "$variant" = perceiver ] && flags="--bottleneck_dim $BOTTLENECK"
  timed ${variant}_pretrain $RUN pretrain $variant wiki.txt --writing_params_path "$OUT_DIR/$variant.pretrain.params" \
    $PRE_FLAGS $BUDGET_FLAGS $flags $COMMON $PRETRAIN_EXTRA
  # The direct protocol (the handout's), then the recite protocol: a reader finetuned from the same
  # pretrained params answers from what they recite about each person (src/recite.py).
  answer_with finetune finetune pretrain $FT_FLAGS
  answer_with reader reader recite --recite $READER_FLAGS
  if [ -z "${PLANNED_MINUTES:-}" ]; then  # no plan (the handout's recipe): the first variant's steps time the rest
    PLANNED_MINUTES=$(awk -v e="$((SECONDS - START))" -v c="$((SECONDS - cycle_start))" -v n="${#VARIANT_LIST[@]}" \
      'BEGIN { printf "%.0f", (e + c * (n - 1)) / 60 }')
    echo "run.sh: at the pace of $variant's steps the whole run takes about $PLANNED_MINUTES minutes"
  fi
done

echo; echo "run.sh: done in $(((SECONDS - START) / 60)) minutes"
# A user's run reports into OUT_DIR; RECORD=1 writes bench/results/report.md and appends to runs.jsonl.
if [ "$RECORD" = 1 ]; then REPORT=(--record); else REPORT=(--out "$OUT_DIR/report.md"); fi
# The command names every setting by which this run differs from a full one (the report gives preset and seed apart).
COMMAND="bash run.sh"
[ "$TOTAL_MINUTES" = 120 ] || COMMAND="TOTAL_MINUTES=$TOTAL_MINUTES $COMMAND"
for name in NOPRETRAIN_EPOCHS FINETUNE_EPOCHS PRETRAIN_EPOCHS; do
  [ -z "${!name}" ] || COMMAND="$name=${!name} $COMMAND"
done
[ -z "$EXTRA_FLAGS" ] || COMMAND="EXTRA_FLAGS=\"$EXTRA_FLAGS\" $COMMAND"
[ "$VARIANTS" = "vanilla perceiver rope" ] || COMMAND="VARIANTS=\"$VARIANTS\" $COMMAND"
python bench/report.py --runs "$OUT_DIR" --preset "$PRESET" --seed "$SEED" --command "$COMMAND" "${REPORT[@]}"
echo "Predictions, params and logs: $OUT_DIR/; TensorBoard: tensorboard --logdir $TB_DIR"
