#!/usr/bin/env bash
# The whole GPU verification of the cuda backend, in one run of at most ~9 min
# on a machine with torch, transformers and triton but no network:
#   kernel and row exactness on CUDA, the pass-cost curve, the held-out lossless stress
#   set, `codespec bench verify` (batch 1 and 8), the edit workload against
#   transformers' prompt lookup and the bench's other workloads against plain decoding,
#   on the default model's shapes with seeded random weights (--real: and its real ones).
# Before it, on a machine with network (docs/gpu.md, "How to verify it"): scripts/gpu-prepare.sh, which puts
# the missing wheels in .whl/ and the default model's config and tokenizer in .gpu/.
# Results: $OUT/gpu-check.json (OUT defaults to ./gpu-out) and a summary printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 scripts/gpu_check.py --assets .gpu --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu-check.log"
