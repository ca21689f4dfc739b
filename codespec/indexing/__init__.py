"""Repository indexing: walk a repository (walk.py), tokenize what a developer would call
source and write a suffix index file (build.py). The index structures themselves are in
codespec.index (numpy + numba, no tokenizer)."""

from codespec.indexing.build import (IndexReport, build_repository_index, build_static_index, default_index_path,
                                     tokenizer_fingerprint)

__all__ = ["IndexReport", "build_repository_index", "build_static_index", "default_index_path",
           "tokenizer_fingerprint"]
