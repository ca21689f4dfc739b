"""`codespec lsp --server` / `--shared`: what goes to the server goes through one worker
per kind (the bound on threads holds over HTTP too)."""

from __future__ import annotations

import socket
import threading

from codespec.lsp.backend import FimRequest
from codespec.lsp.http_backend import HttpBackend


def test_a_change_storm_costs_one_worker_not_a_thread_per_change():
    with socket.socket() as server:  # a server that never answers: a send waits (a thread per change piled up)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        backend = HttpBackend(f"http://127.0.0.1:{server.getsockname()[1]}")
        before = threading.active_count()
        for i in range(300):
            backend.update_document("a.py", "x = 1\n" * 1000 + f"y = {i}\n")
            backend.prefill_ahead("file:///a.py", FimRequest("x = 1\n", "\n", 8, "a.py", middle=f"y = {i}"))
        assert threading.active_count() <= before, [t.name for t in threading.enumerate()]
        assert backend.documents.pending <= 1 and backend.ahead.pending <= 1  # only each key's latest
        backend.close()


def test_the_infill_body_carries_the_layout_and_the_other_files():
    from codespec.prompts import ExtraFile

    request = FimRequest("def f():\n", "\nx = 1\n", 16, "b.py", middle="    ret", layout="spm",
                         extra=(ExtraFile("a.py", "def g():\n    pass\n"),))
    body = HttpBackend.infill_body(request)
    assert body["fim_layout"] == "spm" and body["prompt"] == "    ret"
    assert body["input_extra"] == [{"filename": "a.py", "text": "def g():\n    pass\n"}]
