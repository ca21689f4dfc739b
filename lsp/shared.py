"""One `codespec serve` per user and model, shared by every editor window.

Each `codespec lsp` loading its own model costs every window ~2.5 GB and a model load.
`codespec lsp --shared` instead finds the local server that serves its model settings,
or starts one, and talks to it as `--server` does (lsp/http_backend.py):

    server = attach(settings)          # blocks while a new server loads its model
    HttpBackend(server.url, server.api_key)

Under `<cache_dir>/shared/`, for each model-settings key:
- `KEY.json`: the server's URL, pid and API key (mode 0600, written then renamed);
- `KEY.lock`: held while one language server finds or starts the server, so two
  windows opening at once start one;
- `KEY.clients/PID`: one file per language server attached. The server watches this
  folder (`codespec serve --exit-when-unused DIR`) and exits once no listed process
  has been alive for `CODESPEC_SHARED_GRACE_S` (60 s): a window reload in between
  keeps the model;
- `KEY.log`: the server's log, rotated at 4 MiB (per-request lines only at debug).

The folder is this user's alone (0700, tightened if it was not; a symlink or another
user's folder is refused), and its files are opened without following symlinks.

The server binds 127.0.0.1 with a random API key that only this user can read, so no
other local user can drive it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from codespec.errors import CodespecError
from codespec.settings import child_environment, current
from codespec.tempfiles import alive, open_no_follow, temp_beside

log = logging.getLogger("codespec.lsp")

# the settings a shared server is started with: the ones `codespec lsp` takes that change
# what the model server computes (its own API key is made here). cli/options.py's
# MODEL_FIELDS, SPECULATION_FIELDS and CACHE_FIELDS, max_active_requests and the next-edit layout, spelled
# out: cli imports lsp, so lsp cannot import cli.
PASSED_FIELDS = ("model", "dtype", "device", "quantize", "cache_dir", "threads", "draft_policy",
                 "max_draft_tokens", "min_match_tokens", "max_match_tokens", "look_ahead", "draft_model",
                 "draft_model_window", "kv_cache_mb",
                 "kv_slot_tokens", "prefill_chunk_tokens", "max_active_requests", "index_max_mb", "next_edit_layout")
START_TIMEOUT_S = 1800.0  # the first start may prepare the default model (minutes)
POLL_S = 0.25


def grace_s() -> float:
    return current().shared_grace_s


@dataclass(frozen=True)
class SharedServer:
    url: str
    pid: int
    api_key: str
    log: Path


def passed_settings(settings: Any) -> dict[str, str]:
    return {f: str(getattr(settings, f)) for f in PASSED_FIELDS if getattr(settings, f, None) is not None}


def server_key(settings: Any) -> str:
    """Windows with the same model settings share a server; different ones do not."""
    return hashlib.sha256(json.dumps(passed_settings(settings), sort_keys=True).encode()).hexdigest()[:16]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attach(settings: Any, on_wait: Callable[[str], None] = lambda message: None) -> SharedServer:
    """The running shared server for `settings`, started if there is none; registers this
    process as one of its clients. Returns once it answers (a new one loads its model
    first). Raises CodespecError, one line, when it cannot start."""
    root = private_folder(Path(settings.cache_dir) / "shared")
    key = server_key(settings)
    clients = private_folder(root / f"{key}.clients")
    os.close(os.open(clients / str(os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))  # before the
    # server can look: it must not see none
    with os.fdopen(os.open(root / f"{key}.lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = read_state(root / f"{key}.json")
        if server is None or not alive(server.pid):
            server = start(settings, root, key, clients)
            on_wait(f"started a shared server ({server.url}, pid {server.pid}; log: {server.log})")
        else:
            on_wait(f"using the shared server at {server.url} (pid {server.pid})")
    wait_ready(server)
    return server


def private_folder(path: Path) -> Path:
    """`path` as a folder only this user can enter, made so if needed: an existing one
    that others may write is tightened to 0700; a symlink, or a folder of another user,
    is refused (the API key and the server's log live here)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CodespecError(f"{path} is a symlink or not a folder: remove it, and codespec makes its own")
    if info.st_uid != os.getuid():
        raise CodespecError(f"{path} belongs to another user (uid {info.st_uid}): remove it, or set "
                            "CODESPEC_CACHE_DIR to a folder of yours")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)  # others could read the API key or plant files: no longer
    return path


def read_state(path: Path) -> SharedServer | None:
    try:
        state = json.loads(path.read_text())
        return SharedServer(str(state["url"]), int(state["pid"]), str(state["api_key"]), Path(state["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: start one (the write below replaces it)


def start(settings: Any, root: Path, key: str, clients: Path) -> SharedServer:
    port = free_port()
    api_key = secrets.token_urlsafe(24)
    env = child_environment(**{f"CODESPEC_{f.upper()}": v for f, v in passed_settings(settings).items()})
    env["CODESPEC_API_KEY"] = api_key  # in the environment, not argv, which every user can read
    # no repository of its own (not the first editor's working directory): each language
    # server sends its workspace (POST /v1/index/workspace)
    env.update(CODESPEC_REPO="", CODESPEC_INDEX="", CODESPEC_INDEX_WORKSPACES="true")
    log_path = root / f"{key}.log"
    env["CODESPEC_LOG_FILE"] = str(log_path)  # the server logs there, rotating it (server/logs.py)
    try:  # what the server prints before its logging starts (a crash at import) goes there too
        out = open_no_follow(str(log_path))
    except OSError as exc:
        raise CodespecError(f"{log_path}: cannot open the shared server's log ({exc.strerror}); a symlink there "
                            "is refused: remove it") from None
    with out:
        process = subprocess.Popen(
            [sys.executable, "-m", "codespec", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--exit-when-unused", str(clients)],
            env=env, cwd=root, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True)  # not in the editor's process group: it outlives one window
    server = SharedServer(f"http://127.0.0.1:{port}", process.pid, api_key, log_path)
    state = root / f"{key}.json"
    fd, partial = temp_beside(state)  # mode 0600: the API key is this user's alone
    with os.fdopen(fd, "w") as out:
        json.dump({"url": server.url, "pid": server.pid, "api_key": api_key, "log": str(log_path)}, out)
    os.replace(partial, state)
    threading.Thread(target=process.wait, daemon=True).start()  # reaped if it exits while we run
    return server


def wait_ready(server: SharedServer, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the server answers an authenticated request; a server that exits meanwhile
    is reported with the last line of its log."""
    from codespec.integrations.upstream import UpstreamClient, UpstreamError

    client = UpstreamClient(server.url, server.api_key, timeout=5, peer="the shared codespec server")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.open("/v1/models", method="GET").close()
            return
        except UpstreamError as exc:
            if exc.status is not None:  # it answered, and refused: not the server we started
                raise CodespecError(f"{server.url} is not the shared codespec server: {exc}") from None
        if not alive(server.pid):
            raise CodespecError(f"the shared codespec server exited: {last_line(server.log)} (log: {server.log})")
        if time.monotonic() > deadline:
            raise CodespecError(f"the shared codespec server did not answer within {timeout_s:.0f} s "
                                f"(log: {server.log})")
        time.sleep(POLL_S)


def last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()
    return "no log"


def exit_when_unused(clients: Path, grace: float | None = None, poll_s: float = 1.0) -> threading.Thread:
    """The server side: a daemon thread that ends this process (SIGTERM, uvicorn's own
    graceful shutdown) once no process listed in `clients` has been alive for `grace`."""
    grace = grace_s() if grace is None else grace

    def watch() -> None:
        unused_since: float | None = None
        while True:
            live = 0
            for entry in list(clients.iterdir()) if clients.is_dir() else []:
                if entry.name.isdigit() and alive(int(entry.name)):
                    live += 1
                else:
                    with contextlib.suppress(OSError):
                        entry.unlink()
            now = time.monotonic()
            if live:
                unused_since = None
            elif unused_since is None:
                unused_since = now
            elif now - unused_since >= grace:
                log.info("no editor has used this shared server for %.0f s: exiting", grace)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, name="exit-when-unused", daemon=True)
    thread.start()
    return thread


class SharedBackend:
    """The language server's backend over the shared server: `HttpBackend` to it, its
    workspace indexed there, and a new server started when that one has gone (killed,
    or ended after all its editors had closed while this one slept)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._attach()

    def _attach(self) -> None:
        from codespec.lsp.http_backend import HttpBackend

        self.server = attach(self.settings, on_wait=log.info)
        self.http = HttpBackend(self.server.url, self.server.api_key)

    def _reattach(self, failed: Any) -> None:
        with self._lock:
            if self.http is failed:  # another request has not done it already
                log.warning("the shared server (pid %d) is gone: starting another", self.server.pid)
                failed.close()  # its workers
                self._attach()

    async def next_edit(self, asked: Any) -> list[Any]:
        return await self.http.next_edit(asked)

    async def complete(self, request: Any, on_text: Any) -> str:
        from codespec.lsp.backend import detached

        http = self.http
        try:
            return await http.complete(request, on_text)
        except Exception:
            if alive(self.server.pid):
                raise  # the server is there and answered with an error: say so
            # gone: whatever the transport said (refused, reset, cut mid-stream), start another
        await detached(self._reattach, http)
        return await self.http.complete(request, on_text)

    async def index_workspace(self, folders: list[str], progress: Any) -> str:
        from codespec.lsp.backend import detached

        if not folders:
            return "no workspace folder"
        root = folders[0]  # one static index, as in process (others still get open-buffer drafts)
        progress(f"{Path(root).name}: indexing in the shared server", 0)

        def post() -> str:
            from codespec.integrations.upstream import UpstreamClient

            # a big repository takes minutes to tokenize: the HTTP backend's timeout is for completions
            client = UpstreamClient(self.server.url, self.server.api_key, START_TIMEOUT_S, "the shared server")
            with client.open("/v1/index/workspace", {"root": root}) as response:
                report = json.load(response)
            return f"{Path(root).name}: {report['files']} files, {report['tokens']} tokens (shared server)"

        return await detached(post)

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        self.http.update_document(path, text, saved)

    def record_acceptance(self, accepted: bool) -> None:
        self.http.record_acceptance(accepted)

    def prefill_ahead(self, key: str, request: Any) -> None:
        self.http.prefill_ahead(key, request)

    def close(self) -> None:
        self.http.close()
