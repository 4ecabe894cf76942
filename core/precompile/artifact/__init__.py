"""The pair on disk: an artifact's ``.py`` and its ``.cache``, as files.

Reading and writing a pair (``pair``), the cache's envelope (``envelope``), the metadata
block (``metadata``), signatures (``signing``) and the compiled bytecode a cache carries
(``bytecode``). Torch-free apart from the envelope's lazy read of a cache; importable by
the language server.
"""
