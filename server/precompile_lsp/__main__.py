"""``python -m precompile_lsp``: the language server over stdio.

``-m`` puts the current directory first on ``sys.path``, and an editor starts the server
in the workspace folder: a ``pygls.py`` or ``tomllib.py`` there would be imported by the
server, untrusted workspace or not. Unless Python already left it out (``-P``,
``PYTHONSAFEPATH``, which the VS Code extension sets), it is removed before anything else
is imported.
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from precompile_lsp.server import main

main()
