"""The torch side of the server distribution: the warm worker process and the jobs it
runs (capture, emit, verify). Only this package imports torch and precompile's capture
side; the engine, the language server and the CLI speak to it through
``precompile_lsp.protocol`` and never import it (an import-linter contract holds that).
"""
