"""The language server: `codespec lsp` serves `textDocument/inlineCompletion` (LSP 3.18).

The model runs behind a `CompletionBackend` (backend.py): in process
(inprocess_backend.py, which the CLI loads: the only module here that loads a model), or
in a running `codespec serve` (http_backend.py), so several editors can share one model
and one index.
"""
