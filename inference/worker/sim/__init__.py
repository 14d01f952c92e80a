"""The simulated engine: the worker's one server (inference.worker.server) in front of an engine that sleeps a
profile's latencies (inference.worker.sim_profile) instead of running a model.

`python -m inference.worker --simulate PROFILE ...` answers /health, /info, /metrics and the role's routes through
the same code as a real worker, produces tokens from a fixed vocabulary (`words`), and sends a small fake KV payload
in the real wire format (`kv`). It never imports torch: it starts in a blink and holds a few MiB, so that one host
can carry hundreds of them (inference.worker.sim_host, beside the server it hosts) and the control plane can be
driven at fleet scale. Everything it answers says `simulated: true`.
"""
