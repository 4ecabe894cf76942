"""``python -m precompile_lsp``: the language server over stdio."""

from precompile_lsp.server import main

main()
