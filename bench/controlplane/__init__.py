"""Benchmarks of the control plane: scrape cycle, alert to action, dashboard page, connection reuse."""
