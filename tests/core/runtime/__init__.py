"""Tests of precompile.runtime: what an artifact does on a call -- serve exactly what eager
would, or refuse naming the change."""
