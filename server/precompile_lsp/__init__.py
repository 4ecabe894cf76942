"""The torch-precompile daemon, language server and CLI.

This process never imports torch: captures run in worker processes.
"""
