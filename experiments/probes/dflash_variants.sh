#!/usr/bin/env bash
# DFlash for smollm2-135m, the search's second half (issue 52): the same budget and data as dflash_search.sh
# (chunks 0-31, 500 steps of 2048 tokens at peak lr 1e-3, 2 layers, blocks of 8, one core), varying what the layout
# search kept fixed: where the drafter's layers start (copies of the target's last two or first two layers, not a
# random start), the loss's slot weighting (every slot alike, or decay 2 instead of the paper's 4), and 4 layers.
# Resumable: rerun it and each run goes on from its checkpoint. Curves: grep "held-out top1" out/train/dfv-*/train.log
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-500}
RUNS=${RUNS:-"start28-29 start0-1 uniform L4"}
SRC=out/train/dflash3
for run in $RUNS; do
  out=out/train/dfv-$run
  mkdir -p "$out"
  for f in features.f16 features.f16.json held_out_features.f16 held_out_features.f16.json; do
    [ -e "$out/$f" ] || ln -s "$(realpath $SRC/$f)" "$out/$f"
  done
  layers=2; extra=()
  case $run in
    start28-29) extra=(--start-layers 28,29) ;;
    start0-1) extra=(--start-layers 0,1) ;;
    uniform) extra=(--decay 0) ;;
    decay2) extra=(--decay 2) ;;
    L4) layers=4 ;;
  esac
  OMP_NUM_THREADS=1 .venv/bin/python experiments/probes/dflash_variant.py "${extra[@]}" -- \
    --data out/train/dflash-data/chunks0-31.jsonl.gz --out "$out" --steps "$STEPS" --batch-tokens 2048 \
    --layers "$layers" --block-size 8 --resume >> "$out/train.log" 2>&1
done
