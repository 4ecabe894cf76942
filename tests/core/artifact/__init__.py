"""Tests of precompile.artifact: the pair on disk -- writing, verifying, signing, the cached
bytecode and kernels."""
