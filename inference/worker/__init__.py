"""The worker servers: thin HTTP wrappers around one engine (docs/contracts.md, "Worker HTTP API").

`config` (the command line: the engine's Config plus the server's settings), `server` (lifecycle, admission, shared
routes), `engine_loop` (the thread that owns the engine), `jobs` (one request on the asyncio side and its NDJSON
stream), `protocol` (request checks, OpenAI-shaped errors), `detokenize` (text and stop strings), and one module per
role: `colocated`, `prefill`, `decode`. The server mounts its role's routes and hands them itself; nothing it
imports imports it back.
"""
