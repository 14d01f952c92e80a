"""The simulated worker: the worker's HTTP protocol with latencies drawn from a profile, and no model.

`python -m inference.worker --simulate PROFILE ...` serves /health, /info, /metrics and the role's routes exactly as
a real worker does, but sleeps the profile's prefill and decode times instead of running a forward pass, produces
tokens from a fixed vocabulary, and sends a small fake KV payload in the real wire format. It never imports torch:
it starts in a blink and holds a few MiB, so that one host can carry hundreds of them (`inference.worker.sim.host`)
and the control plane can be driven at fleet scale. Everything it answers says `simulated: true`.
"""
