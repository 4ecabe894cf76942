"""``python -m precompile_lsp.worker``: the warm worker (see process.py)."""

from precompile_lsp.worker.process import main

main()
