"""Benchmarks of the replay simulation: how fast it runs a trace."""
