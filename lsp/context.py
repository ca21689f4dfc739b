"""Cross-file context: the code the person worked on lately in other files,
before the file's own window, in the model's repository layout (<|repo_name|>, then
<|file_sep|>path + text per file, prompts.fim_ids), as llama.vim's ring of chunks does.

A chunk enters when the person leaves a document (asks in another one, or closes it):
the lines around where they were. It replaces that file's older chunk and goes to the
ring's end; the oldest chunks fall out past the token budget. The ring changes only
when the person switches files, never while they type, so every request in a file
shares the same leading tokens and the KV cache keeps them (a file's own chunk is left
out while the person is in that file: its text is in the window already).

    ring = Ring()
    ring.left("a.py", text, offset)        # the person went elsewhere
    ring.context("b.py", budget_tokens=512)  # -> (ExtraFile("a.py", lines around offset),)
"""

from __future__ import annotations

from codespec.prompts import ExtraFile

CHUNK_LINES = 40  # lines per chunk: most of a function around where the person was
LINES_BEFORE = 30  # of them, before the cursor's line (what was just written)
CHARS_PER_TOKEN = 4  # budget in characters per token (code runs ~3.5)
KEEP = 16  # chunks remembered at most (llama.vim's ring_n_chunks)


class Ring:
    def __init__(self) -> None:
        self.chunks: list[ExtraFile] = []  # oldest first

    def left(self, path: str, text: str, offset: int) -> None:
        """The person left `path` (its `text`, the cursor at `offset`)."""
        lines = text.splitlines(keepends=True)
        line = text.count("\n", 0, max(0, min(offset, len(text))))
        start = max(0, line - LINES_BEFORE)
        chunk = "".join(lines[start:start + CHUNK_LINES])
        self.chunks = [c for c in self.chunks if c.filename != path]
        if chunk.strip():
            self.chunks.append(ExtraFile(path, chunk))
        del self.chunks[:-KEEP]

    def context(self, path: str, budget_tokens: int) -> tuple[ExtraFile, ...]:
        """The chunks of other files than `path`, the newest that fit the budget, oldest first.

        >>> ring = Ring()
        >>> ring.left("a.py", "x = 1\\n", 0); ring.left("b.py", "y = 2\\n", 0)
        >>> [c.filename for c in ring.context("c.py", 100)], [c.filename for c in ring.context("a.py", 100)]
        (['a.py', 'b.py'], ['b.py'])
        >>> ring.context("c.py", 0)
        ()
        """
        room = budget_tokens * CHARS_PER_TOKEN
        kept: list[ExtraFile] = []
        for chunk in reversed(self.chunks):
            if chunk.filename == path:
                continue
            room -= len(chunk.filename) + len(chunk.text) + 2
            if room < 0:
                break
            kept.append(chunk)
        return tuple(reversed(kept))
