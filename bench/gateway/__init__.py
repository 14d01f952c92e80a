"""Benchmarks of the gateway: the latency it adds and how its weights split traffic."""
