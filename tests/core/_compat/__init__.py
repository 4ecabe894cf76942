"""Tests of precompile._compat: the capture patches and the translations of private torch."""
