"""Tandem's data plane: engine, workers, KV handoff and the OpenAI-compatible gateway. Never imports Django."""
