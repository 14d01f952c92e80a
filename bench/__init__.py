"""Benchmarks: each prints one JSON document and measures Tandem against baselines in the same run."""
