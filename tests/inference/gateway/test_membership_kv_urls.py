"""The control plane's endpoints answer may name a decode worker's KV address in a per-group `kv_urls` map
(docs/contracts.md): the router keeps it on the worker (its /health shows it), drops it when a later answer no longer
names it, and an answer whose map is not URL → http(s) URL is rejected whole, keeping the last good membership."""
from __future__ import annotations

import pytest

from inference.gateway.config import Config, Mode
from inference.gateway.membership import MembershipError, parse_endpoints
from inference.gateway.routing import Router

P, D1, D2 = "http://127.0.0.1:41001", "http://127.0.0.1:41002", "http://127.0.0.1:41003"
KV = "http://127.0.0.1:41999"


def _answer(kv_urls=None) -> dict:
    group = {"revision": 2, "prefill": [P], "decode": [D1, D2], "colocated": []}
    if kv_urls is not None:
        group["kv_urls"] = kv_urls
    return {"deployment": "demo", "model": "demo", "mode": "disaggregated", "groups": [group]}


def test_a_decode_workers_kv_address_reaches_the_router_and_goes_again():
    router = Router(Config(port=0, prefill_urls=[P], decode_urls=[D1, D2]))
    mode, groups = parse_endpoints(_answer({D1: KV + "/"}))
    router.set_groups(mode, groups)
    assert mode is Mode.DISAGGREGATED
    assert {w.url: w.kv_url for w in router.workers} == {P: None, D1: KV, D2: None}
    assert router.groups[0].describe()["decode"][0]["kv_url"] == KV
    assert "kv_url" not in router.groups[0].describe()["decode"][1]
    router.set_groups(*parse_endpoints(_answer()))
    assert {w.url: w.kv_url for w in router.workers} == {P: None, D1: None, D2: None}


@pytest.mark.parametrize("kv_urls", [[KV], {D1: "ftp://x"}, {D1: 3}])
def test_a_bad_kv_urls_map_rejects_the_answer(kv_urls):
    with pytest.raises(MembershipError, match="'kv_urls' of revision 2 is not an object of URL"):
        parse_endpoints(_answer(kv_urls))
