"""Canary and A/B rollouts: database state (Rollout, AnalysisRun) driven by a reconcile-style pass (driver.py)."""
