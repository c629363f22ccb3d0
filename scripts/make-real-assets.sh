#!/usr/bin/env bash
# Rebuild the two real-model routing traces that ship with sempar (src/sempar/assets/traces/,
# described with their licences in src/sempar/assets/traces/NOTICE) from the numpy files of
# shared/data/real/full-traces (its README says what each array is).
#
#   deepseek-v2-lite-esft.parquet  DeepSeek-V2-Lite (ESFT-vanilla-lite) prefill routing, MIT,
#                                  deepseek-ai/ESFT results/expert_scores/ at commit 579a771
#   gpt-oss-20b-mmlu.parquet       GPT-OSS-20B decode routing of MMLU questions, Apache-2.0,
#                                  AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting data/ at 72b368f
#
# Kept: routed-expert ids (slot 0 = top-1), request offsets, per-request domains / MMLU subjects,
# layer ids, and for GPT-OSS token ids and positions. Dropped: the router weights / probs (they
# would double the size and no placement method reads them) and GPT-OSS's request_dataset /
# prompt_tokens. Size budget: 12.5 MB for both (3.1 + 9.3 MB at zstd level 1; the expert ids
# are close to incompressible, ~20 bits per top-4 row of 32 experts).
#
# The traces are written to a temporary folder and then copied (sempar's output rule keeps its
# own package assets read-only to ordinary runs).
# Usage: scripts/make-real-assets.sh [FULL_TRACES_DIR]
#        (default: $SEMPAR_REAL_DATA/full-traces, else ../shared/data/real/full-traces)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-${SEMPAR_REAL_DATA:-$here/../shared/data/real}/full-traces}
assets=$(python -c 'from sempar.paths import assets_dir; print(assets_dir())')/traces
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sempar import arrays "$src/deepseek-v2-lite-esft.npz" --model deepseek-v2-lite --weights-key '' \
  --licence "MIT" \
  --source "deepseek-ai/ESFT results/expert_scores/ at commit 579a771 (ESFT-vanilla-lite prefill routing of intent, law, summary training samples)" \
  --out "$tmp/deepseek-v2-lite-esft.parquet"
sempar import arrays "$src/gpt-oss-20b-mmlu.npz" --model gpt-oss-20b --weights-key '' \
  --licence "Apache-2.0" \
  --source "AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting data/ at commit 72b368f (greedy decode routing of 524 MMLU / MMLU-Pro questions; token ids index that dump's token-string list)" \
  --out "$tmp/gpt-oss-20b-mmlu.parquet"
for f in deepseek-v2-lite-esft gpt-oss-20b-mmlu; do
  sempar trace validate "$tmp/$f.parquet"
  cp "$tmp/$f.parquet" "$assets/$f.parquet"
done
ls -l "$assets"/deepseek-v2-lite-esft.parquet "$assets"/gpt-oss-20b-mmlu.parquet
