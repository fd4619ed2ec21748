"""The Host allow-list (issue 27.6): a page re-pointing its hostname at a local sidecar (DNS
rebinding) names its own domain in Host (and Origin), and gets 403 in the route's envelope."""

from __future__ import annotations

import pytest

from sidecar.server.hosts import HostRule

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_the_rule():
    rule = HostRule("", "127.0.0.1")
    for ok in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "10.1.2.3", "app.localhost:1", "localhost."):
        assert rule.allows(ok), ok
    for bad in ("attacker.example:8000", "attacker.example", "", "127.0.0.1.nip.io", "localhost.attacker.example", "a:b:c"):
        assert not rule.allows(bad), bad
    named = HostRule("sidecar.internal, .corp.example", "127.0.0.1")
    assert named.allows("sidecar.internal:9") and named.allows("corp.example") and named.allows("a.corp.example")
    assert not named.allows("corp.example.evil")
    assert HostRule("*").allows("anything.example")
    assert HostRule("", "sidecar-host").allows("sidecar-host:80")
    assert rule.allows_origin("http://localhost:3000") and not rule.allows_origin("https://attacker.example")
    assert not rule.allows_origin("null") and not rule.allows_origin("file://localhost")


@pytest.mark.parametrize("path, body, method", [
    ("/v1/chat/completions", CHAT, "POST"),
    ("/v1/messages", CHAT, "POST"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}, "POST"),
    ("/v1/sessions", None, "GET"),
    ("/v1/models", None, "GET"),
])
async def test_a_rebound_host_is_refused_in_the_routes_envelope(path, body, method, make_sidecar, sglang_double):
    client = await make_sidecar()
    port = client.server.port
    resp = await client.request(method, path, json=body, headers={"Host": f"attacker.example:{port}"})
    assert resp.status == 403
    data = await resp.json()
    if path == "/v1/messages":
        assert data["type"] == "error" and data["error"]["type"] == "permission_error"
    else:
        assert data["error"]["code"] == "host_not_allowed"
    assert "attacker.example" in str(data)
    assert sglang_double.requests == []
    ok = await client.request(method, path, json=body, headers={"Host": f"localhost:{port}"})
    assert ok.status == 200, await ok.text()


async def test_a_browser_origin_of_another_host_is_refused(make_sidecar):
    client = await make_sidecar()
    resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://attacker.example"})
    assert resp.status == 403 and "Origin" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://localhost:5173"})
    assert resp.status == 200


async def test_allowed_hosts_names_more(make_sidecar):
    client = await make_sidecar(allowed_hosts="sidecar.internal")
    resp = await client.get("/v1/models", headers={"Host": "sidecar.internal:8000"})
    assert resp.status == 200
    resp = await client.get("/v1/models", headers={"Host": "other.internal:8000"})
    assert resp.status == 403
