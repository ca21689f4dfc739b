"""Where a suggestion lands in a file: the cut every served completion goes through
(cut.py), its indentation fitted to the cursor's line (fit.py), the lines it may show
while still written (lines.py), and the cursor's syntactic place (syntax.py, tree-sitter).
The language server (lsp/) and `/infill` (server/) both serve through it."""
