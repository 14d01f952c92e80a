"""The worker servers: thin HTTP wrappers around one engine (docs/contracts.md, "Worker HTTP API").

`server` (lifecycle, admission, shared routes), `engine_loop` (the thread that owns the engine), `jobs` (one request
on the asyncio side), `protocol` (request checks, OpenAI-shaped errors), `detokenize` (text and stop strings), and
one module per role: `colocated`, `prefill`, `decode`.
"""
