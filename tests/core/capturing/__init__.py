"""Tests of precompile.capturing: what a trace records, bakes and refuses, per tracer and
backend."""
