"""Chaos experiments: declared process faults on a deployment's workers, a steady-state hypothesis checked before,
during and after, abort conditions, and a report per run (docs/chaos.md)."""
