#!/usr/bin/env bash
# DFlash for smollm2-135m: layers and block size searched from scratch on the same data (chunks 0-31 of the shared
# prompts' self-distilled answers, 7,783 sequences) and the same budget (STEPS steps of 2048 tokens, peak lr 1e-3),
# one core each, one after another. The target's features are computed once, by the third training run
# (out/train/dflash3, `make drafters`), and linked into each run's folder: they do not depend on the drafter's layout.
# Resumable: rerun it and each run goes on from its checkpoint. Held-out curves: grep "held-out top1" out/train/dfs-*/train.log
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-500}
SPECS=${SPECS:-"2:8 3:8 2:16 4:8"}  # layers:block of each run, in order
SRC=out/train/dflash3
for spec in $SPECS; do
  set -- ${spec%:*} ${spec#*:}
  out=out/train/dfs-L$1B$2
  mkdir -p "$out"
  for f in features.f16 features.f16.json held_out_features.f16 held_out_features.f16.json; do
    [ -e "$out/$f" ] || ln -s "$(realpath $SRC/$f)" "$out/$f"
  done
  OMP_NUM_THREADS=1 .venv/bin/python -m specviz train dflash --data out/train/dflash-data/chunks0-31.jsonl.gz \
    --out "$out" --steps "$STEPS" --batch-tokens 2048 --layers "$1" --block-size "$2" --resume \
    > "$out/train.log" 2>&1
done
