"""The node agent process's own state: which node it is, and how it runs worker processes.

`node_name` is None outside an agent (the control worker, tests with eager tasks) and in a simulated fleet (one
process serving many nodes), where agent tasks act on whatever node the row names.

`launcher` spawns, checks and stops worker processes: the `processes` module (real OS processes), or in a
simulated fleet a `controlplane.agent.simulated.SimulatedProcesses`, whose workers live in simulated worker hosts.
Both offer spawn, is_alive, stop, reap, exit_code, log_tail and free_port with the same meaning.

`simulated` is True in a simulated fleet: its nodes run no torch benchmark (controlplane.agent.host).
"""
from __future__ import annotations

from controlplane.agent import processes

node_name: str | None = None
launcher = processes
simulated = False
