"""Benchmarks of pipecat_veena; each writes its own section of BENCHMARKS.md."""
