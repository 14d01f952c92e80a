"""The node agent process's own state: which node it is. None outside an agent (the control worker, tests with
eager tasks), where agent tasks act on whatever node the row names."""
from __future__ import annotations

node_name: str | None = None
