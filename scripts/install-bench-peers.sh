#!/usr/bin/env bash
# Install the benchmark-only peers into the active virtualenv (never vendored, never a
# runtime dependency): matplotlib for the plots, arctic-inference's suffix tree
# (SuffixDecoding), built from its PyPI sdist, and llama.cpp's server (below; skip it
# with CODESPEC_SKIP_LLAMACPP=1).
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

# llama.cpp's llama-server (the peer a CPU user picks: what llama.vim talks to), built
# from the source vendored in the llama-cpp-python sdist (PyPI: the registry this
# machine reaches), plus the default model as a BF16 GGUF: the official Q4_K_M GGUF
# (joined from the part packages, sha256-checked) dequantised by llama-quantize, the
# same values codespec's bf16 copy holds. `codespec bench --systems llamacpp,...` finds
# both in $CODESPEC_PEERS_DIR (default ~/.cache/codespec/peers). ~10 min on 2 cores.
if [ "${CODESPEC_SKIP_LLAMACPP:-0}" != "1" ]; then
    LLAMA_CPP_PYTHON_VERSION=0.3.36
    PEERS="${CODESPEC_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/codespec/peers}"
    mkdir -p "$PEERS"
    if [ ! -x "$PEERS/llama.cpp/bin/llama-server" ]; then
        pip install -q 'cmake>=3.18' ninja
        work="$(mktemp -d)"
        trap 'rm -rf "$work"' EXIT
        pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work"
        tar -xzf "$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$work"
        src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
        # the sdist keeps the submodule's .git file, pointing at a parent repository it
        # does not ship: cmake's version step would fail on it
        mv "$src/.git" "$src/.git.sdist" 2>/dev/null || true
        cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DCMAKE_INSTALL_PREFIX="$PEERS/llama.cpp.tmp" > "$work/cmake.log" \
            || { tail -20 "$work/cmake.log"; exit 1; }
        cmake --build "$work/build" --target llama-server llama-quantize llama-bench -j "$(nproc)" \
            > "$work/build.log" || { tail -30 "$work/build.log"; exit 1; }
        rm -rf "$PEERS/llama.cpp.tmp" && mkdir -p "$PEERS/llama.cpp.tmp/bin"
        cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" "$work/build/bin/llama-bench" \
            "$PEERS/llama.cpp.tmp/bin/"
        find "$work/build" -name '*.so*' -exec cp -a {} "$PEERS/llama.cpp.tmp/bin/" \;
        rm -rf "$PEERS/llama.cpp" && mv "$PEERS/llama.cpp.tmp" "$PEERS/llama.cpp"
    fi
    GGUF_BF16="$PEERS/qwen2.5-coder-0.5b-instruct-bf16.gguf"
    if [ ! -f "$GGUF_BF16" ]; then
        q4="$PEERS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
        python -c "from pathlib import Path; from codespec.models.default import export_gguf; export_gguf(Path('$q4'))"
        LD_LIBRARY_PATH="$PEERS/llama.cpp/bin" "$PEERS/llama.cpp/bin/llama-quantize" --allow-requantize \
            "$q4" "$GGUF_BF16.tmp" BF16 > /dev/null
        mv "$GGUF_BF16.tmp" "$GGUF_BF16"
    fi
    echo "llama.cpp: ok ($PEERS/llama.cpp/bin/llama-server, $GGUF_BF16; codespec bench now runs llamacpp)"
fi
