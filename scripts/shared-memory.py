"""Memory of N editor windows' language servers, each with its own model in process
against `--shared` (one `codespec serve` for all), on the default model: PSS (pages
shared between processes, such as mapped weights, counted once across them) and private
memory, once every window reports ready, before any request. Linux (/proc).

    python scripts/shared-memory.py --windows 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from codespec.bench.editor import stop_client
from codespec.settings import Settings


def memory_mb(pid: int) -> tuple[float, float]:
    """(PSS, private) of a process, in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    kb = {k: int(v.split()[0]) for k, v in fields.items()}
    return kb["Pss"] / 1024, (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024


async def window(root: Path, shared: bool) -> tuple[LanguageClient, list[str]]:
    client, states = LanguageClient("window", "1"), []

    @client.feature("codespec/status")
    def on_status(params) -> None:
        states.append(params.get("state") if isinstance(params, dict) else params.state)

    await client.start_io(sys.executable, "-m", "codespec", "lsp", "--model", "default", *(["--shared"] * shared))
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), initialization_options={"indexWorkspace": False},
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)]))
    client.initialized(types.InitializedParams())
    return client, states


async def measure(windows: int, shared: bool) -> None:
    root = Path(tempfile.mkdtemp(prefix="codespec-ws-"))
    started = time.monotonic()
    opened = await asyncio.gather(*(window(root, shared) for _ in range(windows)))
    while not all(states and states[-1] in ("ready", "error") for _, states in opened):
        await asyncio.sleep(0.2)
    ready_s = time.monotonic() - started
    pids = [client._server.pid for client, _ in opened]
    if shared:
        state = next((Settings().cache_dir / "shared").glob("*.json"))
        pids.append(json.loads(state.read_text())["pid"])
    rows = [memory_mb(pid) for pid in pids]
    label = "--shared" if shared else "in process"
    print(f"{windows} windows, {label}: ready in {ready_s:.1f} s; PSS {sum(r[0] for r in rows):.0f} MB in all; "
          f"per process (PSS/private MB): {', '.join(f'{p:.0f}/{u:.0f}' for p, u in rows)}")
    for client, _ in opened:
        await stop_client(client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(measure(args.windows, shared=False))
    asyncio.run(measure(args.windows, shared=True))


if __name__ == "__main__":
    main()
