"""The language server: `codespec lsp` serves `textDocument/inlineCompletion` (LSP 3.18).

Never imports torch: the model runs behind a `CompletionBackend`, either in process
(`codespec.server.lsp_backend`, loaded by the CLI) or in a running `codespec serve`
(`lsp.http_backend`), so several editors can share one model and one index.
"""
