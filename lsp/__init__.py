"""The language server (pygls) that serves editors; never imports torch.

Its handlers arrive with the "language server" issue; the package exists now so that
`codespec.lsp` resolves through the `codespec/lsp -> ../lsp` link from the start.
"""
