"""A Chaos Toolkit extension that drives a Tandem fleet through Tandem's REST API: probes read Tandem's own
evaluation of an experiment's steady-state hypothesis (`probes`), actions start a Tandem run and wait for its
verdict, or abort it (`actions`). It imports neither Django nor the control plane: it runs wherever `chaos` runs,
with the API's address and a token (docs/chaos.md, "Chaos Toolkit").

An experiment exported by Tandem (GET .../chaos/experiments/{name}/chaostoolkit.json) uses it as it is:

    TANDEM_URL=http://tandem:8000 TANDEM_TOKEN=... chaos run demo-pause-decode.json
"""

__version__ = "1.0.0"
