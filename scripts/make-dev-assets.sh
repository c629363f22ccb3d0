#!/usr/bin/env bash
# Rebuild the committed assets from the registries: corpus -> tokenizer -> tiny models -> dev traces.
# About 120 minutes on a 2-core machine (the first two trainings run side by side, one thread
# each; then tiny-moe64-h8).
# Usage: scripts/make-dev-assets.sh [CORPUS_DIR]   (default: ~/.cache/sempar/corpus)
set -euo pipefail
# The output rule treats sempar's installed package as an input (no run may write into it);
# this script is the build tooling that rebuilds the committed assets there on purpose.
export SEMPAR_WRITE_PACKAGE_ASSETS=1
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
for model in tiny-moe64 tiny-mixtral; do
  sempar record --model "$model" --no-weights --out "$assets/traces/$model.parquet" \
    $(for d in code docs literature math chat de-ru; do printf -- '--text %s ' "$heldout/$d.txt"; done)
done
# tiny-moe64-h8's trace (what `bench --model tiny-moe64-h8` fits on) from the first 58 % of each
# held-out text, cut at a request boundary, so the traces stay within their 30 MB budget.
python - "$heldout" <<'PY'
import sys
from pathlib import Path
from sempar.trace.record import DOC_MARKER
for f in Path(sys.argv[1]).glob("*.txt"):
    lines = f.read_text().split("\n")
    total, n = sum(len(l) + 1 for l in lines), 0
    for i, l in enumerate(lines):
        n += len(l) + 1
        if n > 0.58 * total and (l == DOC_MARKER or not l.strip()):
            break
    f.with_suffix(".h8").write_text("\n".join(lines[:i]) + "\n")
PY
sempar record --model tiny-moe64-h8 --no-weights --out "$assets/traces/tiny-moe64-h8.parquet" \
  $(for d in code docs literature math chat de-ru; do printf -- '--text %s:%s ' "$heldout/$d.h8" "$d"; done)
rm -r "$heldout"
