"""The OpenAI-compatible gateway: `python -m inference.gateway`. It never tokenizes; workers own the model."""
