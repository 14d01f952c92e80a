"""Helpers the benchmarks share: import path, model folders, timing, JSON output, baselines, seeded fleet data."""
