"""Write-then-rename temporaries a killed writer left are removed by the next writer."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from codespec.index import store
from codespec.tempfiles import remove_orphans, temp_beside


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_orphans_of_dead_writers_go_live_ones_stay(tmp_path):
    target = tmp_path / "repo.csidx"
    orphan = tmp_path / f".repo.csidx.{dead_pid()}.x1y2.tmp"
    live = tmp_path / f".repo.csidx.{os.getppid()}.z3.tmp"  # a writer still running (our parent)
    other = tmp_path / f".other.csidx.{dead_pid()}.q9.tmp"  # another file's: not this writer's to judge
    for path in (orphan, live, other):
        path.write_bytes(b"partial")
    assert remove_orphans(target) == [orphan]
    assert live.exists() and other.exists()
    fd, name = temp_beside(target)
    os.close(fd)
    assert f".repo.csidx.{os.getpid()}." in name and name.endswith(".tmp")


def test_an_index_save_cleans_what_a_killed_build_left(tmp_path):
    out = tmp_path / "repo.csidx"
    orphan = tmp_path / f".repo.csidx.{dead_pid()}.abc.tmp"
    orphan.write_bytes(b"\0" * 4096)
    corpus = np.arange(8, dtype=np.int32)
    store.save(out, store.StoredIndex("tok", "/repo", [], corpus, np.argsort(corpus).astype(np.int32), {}))
    assert not orphan.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo.csidx"]
    assert store.load(out).corpus.tolist() == corpus.tolist()
