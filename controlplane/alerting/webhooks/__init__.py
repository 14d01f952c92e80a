"""Webhooks: signing (out), payload formats (out), HTTP transport with permanent/transient errors (out), and the
Alertmanager receiver's payload parsing and mapping (in)."""
