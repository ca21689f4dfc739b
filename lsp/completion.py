"""Inline completions (`textDocument/inlineCompletion`): the cursor's context is
classified (`syntax.classify`: nothing mid-word, one line, or a block); the forwarding
cache answers when the user typed along the completion shown last (or asks again where
it was shown, or where an accepted completion ends: that one is computed ahead, right
after the accept); otherwise, after a short debounce, the backend generates, and stops
where the block ends. Whatever the path, the text served is cut for the request it
answers by one function, `landing.cut.Landing.fit`. The latest request per document
wins: a newer request (or `$/cancelRequest`) cancels the older one's generation.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Callable

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from codespec.landing.cut import Landing
from codespec.landing.fit import fit_indent, replaced_after, rest_of_line
from codespec.landing.lines import whole_lines
from codespec.landing.syntax import Mode, classify
from codespec.lsp.backend import settle
from codespec.lsp.documents import open_document, opened, text_of
from codespec.lsp.forwarding import Shown, along, forward
from codespec.lsp.window import fim_request

log = logging.getLogger("codespec.lsp")
ACCEPT_COMMAND = "codespec.accepted"  # each item's command: counts the accept, computes the next one ahead
OFFERED_KEEP = 64  # accept-command keys remembered (the items of the last few requests)

async def complete(ls: Any, params: types.InlineCompletionParams) -> types.InlineCompletionList | None:
    uri = params.text_document.uri
    asked_at = time.monotonic()
    if ls.backend is None and ls.loading is not None:
        await asyncio.shield(ls.loading)  # cancelled with the request (a keystroke, `$/cancelRequest`)
    if not ls.options.enable or ls.backend is None:
        return None
    doc = open_document(ls, uri)
    text = text_of(doc)
    lines = doc.lines
    if params.position.line > len(lines) or params.position.character > 1 << 20:  # len(lines): after a final \n
        raise JsonRpcInvalidParams(f"position {params.position.line}:{params.position.character} is outside "
                                   f"the document ({len(lines)} lines)")
    # pygls converts the client's position (UTF-16 unless negotiated otherwise) to an index
    # (a character past the line's end counts as its end)
    offset = doc.offset_at_position(params.position)
    if "\r\n" in doc.source:
        offset -= doc.source[:offset].count("\r\n")
    ls.asked_at(uri, text, offset)
    ahead = ls.ahead.pop(uri, None)
    if ahead is not None:
        if ahead[0] == text[:offset]:
            await asyncio.shield(ahead[1])  # computed since the accept: finish it rather than start over
        else:
            ahead[1].cancel()  # the user went elsewhere: it must not cancel this request later
    language_id = doc.language_id or ""
    cached = await typed_along(ls, uri, text[:offset])
    shown = ls.shown.get(uri)
    if cached is not None and shown is not None:  # cut again for this request: its block, not the one it was made for
        return _items(ls, params.position, cached, Landing.at(text, offset, language_id, shown.mode, shown.indent),
                      uri)
    landing = landing_at(ls, text, offset, language_id)
    completion = await generate(ls, uri, landing, asked_at)
    answer = None if completion is None else _items(ls, params.position, completion, landing, uri)
    if answer is None and params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked:
        # asked for explicitly: say so rather than spin and show nothing
        ls.status("ready", NOTHING_HERE)
    return answer


def landing_at(ls: Any, text: str, offset: int, language_id: str) -> Landing:
    """Where a request at `offset` lands; one line only when the editor asked for that."""
    mode = classify(text, offset, language_id)
    return Landing.at(text, offset, language_id, Mode.SINGLE if mode is Mode.MULTI and not ls.options.multiline
                      else mode)


NOTHING_HERE = "no suggestion here: the model ended the block at once, or only repeated the lines below"


def covered(ls: Any, uri: str, prefix: str) -> bool:
    """A generation already running serves a request at `prefix`: one the editor asked
    there (VS Code asks again right after an accept, before it runs the item's command),
    or one answered early whose rest continues the accepted text. A second generation
    would cancel it, and the editor's request would be answered null."""
    if uri in ls.in_flight and ls.in_flight[uri][1] == prefix:
        return True
    running = ls.background.get(uri)
    return running is not None and not running.done() and along(ls.shown.get(uri), prefix)


async def typed_along(ls: Any, uri: str, prefix: str) -> str | None:
    """The forwarding cache's answer: the rest of the completion shown last, when the
    person typed (or accepted) along it. While a generation answered early is still going
    on for that completion, wait for its next whole line rather than start over."""
    while True:
        cached = forward(ls.shown.get(uri), prefix)
        running = ls.background.get(uri)
        if running is None or running.done() or not along(ls.shown.get(uri), prefix):
            return cached
        if cached is not None and "\n" in cached.lstrip("\n"):
            return cached  # a whole line beyond what was typed is ready
        await asyncio.sleep(0.01)


async def complete_ahead(ls: Any, uri: str, prefix: str) -> None:
    """After an accept, compute the next completion at the end of the accepted text, so
    that the editor's next request finds it in the cache."""
    for _ in range(50):  # the accepted text reaches the server as a didChange soon after
        doc = opened(ls, uri)
        if doc is None:  # closed meanwhile
            return
        text = text_of(doc)
        if text.startswith(prefix):
            break
        await asyncio.sleep(0.02)
    else:
        return
    try:
        await generate(ls, uri, landing_at(ls, text, len(prefix), doc.language_id or ""))
    except (asyncio.CancelledError, Exception):
        log.debug("completion ahead dropped", exc_info=True)


async def generate(ls: Any, uri: str, landing: Landing, asked_at: float | None = None) -> str | None:
    """Generate a completion where `landing` says (cancelling the document's older one),
    cut for it; cached in `ls.shown` for the forwarding cache.

    Latency first: once `latencyBudgetMs` has passed since the request came (`asked_at`,
    `time.monotonic()`)
    and whole lines are ready, the request is answered with them, and the generation goes
    on in the background to the block end, into the forwarding cache: the editor's next
    request, after the person accepted or typed along those lines, finds the rest there."""
    assert ls.backend is not None
    loop = asyncio.get_running_loop()
    asked_at = time.monotonic() if asked_at is None else asked_at
    text, offset, language_id = landing.text, landing.offset, landing.language_id
    if landing.mode is Mode.NONE:
        return None
    prefix = text[:offset]
    failure = ""
    for previous in (ls.in_flight.pop(uri, (None, ""))[0], ls.background.pop(uri, None)):
        if previous is not None:
            previous.cancel()  # the latest request per document wins
    task = asyncio.current_task()
    assert task is not None
    ls.in_flight[uri] = (task, prefix)
    try:
        await asyncio.sleep(ls.options.debounce_ms / 1000)  # a keystroke storm cancels here
        ls.status("busy")
        opts = ls.options
        request, held = fim_request(text, offset, opts, ls.relative_path(uri), ls.context(uri))

        def finish(raw: str) -> str:
            healed = held.heal(raw)
            return "" if healed is None else landing.fit(healed)

        early: asyncio.Future[str] = loop.create_future()
        budget_s = opts.latency_budget_ms / 1000

        def on_text(so_far: str) -> bool:  # any thread (the scheduler's, an HTTP reader's)
            healed = held.heal(so_far)
            if healed is None:
                return False  # the model disagrees with the cursor's indentation
            kept, finished = landing.cut(healed)
            if not finished and opts.latency_budget_ms and time.monotonic() - asked_at >= budget_s:
                lines = whole_lines(fit_indent(kept, text, offset, language_id))
                if lines.strip():
                    loop.call_soon_threadsafe(settle, early, lines)
                    loop.call_soon_threadsafe(_grow, ls, uri, prefix, lines)
            return not finished

        full = asyncio.ensure_future(ls.backend.complete(request, on_text=on_text))
        try:
            await asyncio.wait({full, early}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            full.cancel()
            raise
        if not full.done():  # answer with the lines ready; the rest goes on into the cache
            ls.background[uri] = full
            full.add_done_callback(lambda f: _store_rest(ls, uri, landing, finish, f))
            completion = early.result()
        else:
            try:
                raw = full.result()
            except Exception as exc:  # the backend failed (server gone, prompt refused): say so, serve on
                log.warning("completion failed: %s", exc)
                failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                return None
            completion = finish(raw)
    finally:
        if ls.in_flight.get(uri, (None, ""))[0] is task:
            del ls.in_flight[uri]
        if uri not in ls.background:
            ls.status("error" if failure else "ready", failure)
    if not completion:
        return None
    ls.shown[uri] = Shown(prefix, completion, landing.mode, landing.indent)
    ls.backend.record_acceptance(False)
    return completion


def _grow(ls: Any, uri: str, prefix: str, lines: str) -> None:
    """Whole lines of a generation answered early, into the forwarding cache as they come."""
    shown = ls.shown.get(uri)
    if uri in ls.background and shown is not None and shown.prefix == prefix and lines.startswith(shown.text):
        ls.shown[uri] = Shown(prefix, lines, shown.mode, shown.indent)


def _store_rest(ls: Any, uri: str, landing: Landing, finish: Callable[[str], str],
                full: asyncio.Future[str]) -> None:
    """A generation that went on after its request was answered: its whole block replaces
    the lines shown, in the forwarding cache."""
    if ls.background.get(uri) is full:
        del ls.background[uri]
        ls.status("ready")
    if full.cancelled() or full.exception() is not None:
        return
    completion = finish(full.result())
    prefix = landing.text[: landing.offset]
    if completion:
        shown = ls.shown.get(uri)
        if shown is None or shown.prefix == prefix:  # nothing newer was shown meanwhile
            ls.shown[uri] = Shown(prefix, completion, landing.mode, landing.indent)


_keys = itertools.count(1)


def _items(ls: Any, position: types.Position, completion: str, landing: Landing,
           uri: str) -> types.InlineCompletionList | None:
    """The answer to a request where `landing` says: every path ends here, and serves
    `completion` only as `Landing.fit` cuts it for this request (None: nothing left)."""
    completion = landing.fit(completion)
    if not completion:
        return None
    text, offset = landing.text, landing.offset
    # the command's one argument is a key: the server keeps what the document starts with
    # once the item is accepted
    key = f"c{next(_keys)}"
    ls.offered[key] = (uri, text[:offset] + completion)
    while len(ls.offered) > OFFERED_KEEP:
        ls.offered.popitem(last=False)
    # closers the editor put after the cursor (an auto-closed bracket) that the completion
    # writes itself are replaced, not doubled; they are ASCII, so characters are UTF-16 units
    replaced = replaced_after(completion, rest_of_line(text, offset))
    end = types.Position(line=position.line, character=position.character + replaced)
    item = types.InlineCompletionItem(
        insert_text=completion,
        range=types.Range(start=position, end=end),
        command=types.Command(title="codespec: accepted", command=ACCEPT_COMMAND, arguments=[key]),
    )
    return types.InlineCompletionList(items=[item])
