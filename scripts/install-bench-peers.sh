#!/usr/bin/env bash
# Install the benchmark-only peers into the active virtualenv (never vendored, never a
# runtime dependency): matplotlib for the plots, and arctic-inference's suffix tree
# (SuffixDecoding), built from its PyPI sdist.
#
# arctic-inference ships only an sdist and its isolated build requires torch>=2.10,
# which pip resolves to a multi-GB CUDA build. Building without isolation against the
# torch already installed (the CPU 2.13.0 of the set-up command) avoids that; only the
# suffix tree extension is compiled (its CUDA ops need ARCTIC_INFERENCE_PRECOMPILED_OPS).
# Needs cmake-capable g++ with C++20 (g++ 12 here); ~1 min on 2 cores.
set -euo pipefail
if [ -z "${VIRTUAL_ENV:-}" ]; then
    echo "error: activate the virtualenv codespec is installed in first (. .venv/bin/activate)" >&2
    exit 1
fi
python -c "import torch" 2>/dev/null || { echo "error: install torch first (pip install torch==2.13.0)" >&2; exit 1; }
pip install -q 'matplotlib>=3.8' setuptools wheel ninja 'cmake>=3.18' nanobind==2.9.2 protobuf==5.29.6 grpcio-tools
pip install -q --no-build-isolation --no-deps arctic-inference==0.3.0
python -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(8)" \
    && echo "arctic-inference suffix tree: ok (codespec bench now runs arctic-tree)"
