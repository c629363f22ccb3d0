#!/usr/bin/env bash
# Rebuild the committed assets from the registries: corpus -> tokenizer -> tiny models -> dev traces.
# About 120 minutes on a 2-core machine (the first two trainings run side by side, one thread
# each; then tiny-moe64-h8).
# Usage: scripts/make-dev-assets.sh [CORPUS_DIR]   (default: ~/.cache/sempar/corpus)
set -euo pipefail
corpus=${1:-$HOME/.cache/sempar/corpus}
assets=$(python -c 'from sempar.paths import assets_dir; print(assets_dir())')
sempar corpus fetch --out "$corpus"
sempar train-tiny --model tokenizer --corpus "$corpus"
sempar train-tiny --model tiny-moe64 --corpus "$corpus" --minutes 36 --threads 1 &
sempar train-tiny --model tiny-mixtral --corpus "$corpus" --minutes 36 --threads 1 &
wait
# The 8-head variant (TP at G = 8), alone, one thread (two threads on a loaded machine took 15x
# the CPU per step of one thread on an idle one).
sempar train-tiny --model tiny-moe64-h8 --corpus "$corpus" --minutes 36 --threads 1
heldout=$(mktemp -d)
sempar corpus heldout --corpus "$corpus" --out "$heldout"
for model in tiny-moe64 tiny-mixtral tiny-moe64-h8; do
  sempar record --model "$model" --no-weights --out "$assets/traces/$model.parquet" \
    $(for d in code docs literature math chat de-ru; do printf -- '--text %s ' "$heldout/$d.txt"; done)
done
rm -r "$heldout"
