"""Benchmarks of the engine and the worker: decode throughput, single-stream speed-ups, KV handoff, stage split."""
