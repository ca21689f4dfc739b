"""index.warm_up() loads every numba kernel a draft calls, with every argument type the
proposers pass: a kernel typed for the first time compiles inside a request when numba's
disk cache is cold (a fresh machine: 0.6 s in one timed H100 request; a
static index loaded from its file, read-only mapped arrays: two ~3.5 s stalls in a
language server's typing replay)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import numba

import codespec.index as index_package
from codespec.index import SuffixIndex
from codespec.index.segment import MAX_OCCURRENCES
from codespec.index.warm import warm_up
from codespec.policy.proposer import IndexedProposer, PromptLookupProposer


def _signatures() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for info in pkgutil.iter_modules(index_package.__path__):
        module = importlib.import_module(f"codespec.index.{info.name}")
        for name, kernel in vars(module).items():
            if isinstance(kernel, numba.core.registry.CPUDispatcher):
                found[f"{info.name}.{name}"] = set(map(str, kernel.signatures))
    return found


def test_warm_up_types_every_kernel_the_proposers_call():
    """In a fresh interpreter: numba's types are per process, and other tests in this
    one may have typed the kernels already."""
    check = "from tests.index.test_warm import warmed_proposers_type_nothing_new as f; f()"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def warmed_proposers_type_nothing_new() -> None:
    import tempfile
    from pathlib import Path

    warm_up()
    before = _signatures()
    assert any(before.values()), "no numba kernel found: the test looks in the wrong place"
    prompt = [1000 + i for i in range(200)] + [7, 8, 9] * 5
    index = SuffixIndex.build({"a.py": prompt[::-1] + [7, 8, 9, 10], "b.py": [7, 8, 9] * 3})
    saved = Path(tempfile.mkdtemp()) / "index.csidx"
    index.save(saved)
    loaded = SuffixIndex.load(saved)  # read-only mapped arrays, as serve and lsp load theirs
    # a dynamic document where the match occurs more often than a draft reads (the tail
    # segment's scan subsamples its occurrences)
    crowded = SuffixIndex()
    crowded.add_document("buf:a.py", [7, 8, 9, 12] * (MAX_OCCURRENCES + 50))
    for proposer in (IndexedProposer(index), IndexedProposer(loaded), IndexedProposer(crowded),
                     IndexedProposer(SuffixIndex()), PromptLookupProposer()):
        for _ in range(2):  # the second request finds the first one's output in the index
            session = proposer.start(prompt)
            output = []
            for token in [7, 8, 9, 11, 7, 8]:
                session.candidates(16)
                session.draft(16)
                session.draft(16, tree=True)
                session.extend([token])
                output.append(token)
            session.finish(output)
    after = _signatures()
    assert {k: v - before.get(k, set()) for k, v in after.items() if v - before.get(k, set())} == {}
