#!/usr/bin/env bash
# Gather what scripts/gpu-check.sh needs on a GPU machine without network: the
# dependencies its image lacks as cp312 manylinux wheels (.whl/) and the default model's
# config and tokenizer files (.gpu/; the model itself is prepared here first if needed);
# gguf reads the real weights there (scripts/gpu-weights.sh); transformers 5.18 because
# the image's 5.17 converts the GGUF's tokenizer without its FIM tokens (2026-11-28).
# Both folders stay out of git; together ~30 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl .gpu
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4 annotated-types==0.8.0 \
    typing-inspection==0.4.5 pydivsufsort==0.0.20 pathspec==1.1.1 typing_extensions==4.16.0 gguf==0.19.0 \
    transformers==5.18.0
model="$(python3 -m codespec model info --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["path"])')"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
    cp "$model/$f" .gpu/
done
du -sh .whl .gpu
