"""The worker: one HTTP server (docs/contracts.md, "Worker HTTP API") in front of one engine, real or simulated.

`config` (the command line: the engine's Config, or with --simulate the profile's SimSettings, plus the server's
settings), `server` (lifecycle, admission, shared routes), `seams` (what the server drives, `WorkerEngine`, and what the
role handlers use, `RoleHost`), `model_engine` (the real engine: `engine_loop`, the thread that owns inference.engine,
and `open_requests`, what becomes of each request there, with the tokenizer and the KV wire format), `sim` (the
simulated engine and the host that runs many workers in one process), `jobs` (one request on the asyncio side and its
NDJSON stream), `protocol` (request checks, OpenAI-shaped errors), `detokenize` (text and stop strings), and one module
per role: `colocated`, `prefill`, `decode`. The server mounts its role's routes and hands them itself; nothing it
imports imports it back.

A request takes four shapes here: `protocol.GenerateRequest` (a checked body), the KV header of the wire format (a
dict), `jobs.Job` (its mailbox on the asyncio side) and `engine_request.EngineRequest` (the engine's side of it,
answered with `Event`s).
"""
