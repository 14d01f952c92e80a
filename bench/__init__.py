"""Benchmarks: each prints one JSON document and measures Tandem against baselines in the same run.

Grouped by what they measure: engine/, gateway/, controlplane/, fleet/; their shared helpers are in lib/.
"""
