"""Benchmarks of a whole fleet: a simulated fleet under one control plane, its profile, capacity validation."""
