"""Documented promises of the HTTP and WebSocket surfaces that no other test proved, each
checked over real sockets against a real relay, with the numbers and names the docs print:
no permessage-deflate (docs/reference/flags.md), webhook signatures only with a secret and the
pending-bytes bound of the webhook outbox (flags.md), Durable Streams' token and origin
refusals and the subscription API's bounds (docs/reference/errors.md), the CORS preflight's
values (docs/how-to/security.md), and ``--web-root``'s bounds (flags.md)."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook
from token_relay.core.grants import Role
from token_relay.edge.durablehooks import MAX_SUBSCRIPTIONS
from token_relay.edge.web import MAX_FILE_BYTES, MAX_FILES
from token_relay.tokens import mint

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..harness import WebhookReceiver, eventually
from .test_pipelining import _answers, _request
from .test_webhooks import FAST, SECRET, _http, _publish

TEXT = {"Content-Type": "text/plain"}


# ---------------------------------------------------------------- flags.md: no deflate


async def test_a_client_offering_permessage_deflate_gets_no_extension_on_any_endpoint() -> None:
    """flags.md: "Permessage-deflate compression is off on every endpoint"."""
    running, relay = await start_relay()
    async with relay:
        for path in ("/produce?channel=c", "/subscribe?channel=c", "/ai-sdk/ws"):
            # websockets' client offers permessage-deflate unless told not to.
            async with running.connect(path, compression="deflate") as ws:
                offered = ws.request.headers.get_all("Sec-WebSocket-Extensions")
                assert any("permessage-deflate" in value for value in offered), path
                assert ws.response.status_code == 101, path
                assert ws.response.headers.get_all("Sec-WebSocket-Extensions") == [], path


# ---------------------------------------------------------------- flags.md: webhooks


async def test_a_webhook_post_is_signed_only_with_a_webhook_secret() -> None:
    """flags.md: ``--webhook-secret`` ... "without it no `webhook-signature` is sent"."""
    with WebhookReceiver() as receiver:
        running, relay = await start_relay(webhooks=(receiver.url,), **FAST)
        async with relay:
            await _publish(running, "plain", 1)
            await eventually(lambda: len(receiver.delivered()) == 1, what="an unsigned POST")
        signed_running, signed_relay = await start_relay(
            webhooks=(receiver.url,), webhook_secret=SECRET, **FAST
        )
        async with signed_relay:
            await _publish(signed_running, "signed", 1)
            await eventually(lambda: len(receiver.delivered()) == 2, what="a signed POST")
    unsigned, signed = receiver.received
    assert unsigned.json()["channel"] == "plain" and signed.json()["channel"] == "signed"
    assert "webhook-id" in unsigned.headers and "webhook-timestamp" in unsigned.headers
    assert "webhook-signature" not in unsigned.headers
    assert Webhook(SECRET).verify(signed.body, signed.headers)["channel"] == "signed"


async def _publish_text(running: RunningRelay, channel: str, ids: list[str], text: str) -> None:
    async with running.connect(f"/produce?channel={channel}") as producer:
        for message in ids:
            await send_json(producer, {"id": message, "delta": text, "final": True})
            assert (await recv_json(producer))["type"] == "ack"


@pytest.mark.parametrize("text", ["x" * 1000, "🚀" * 300], ids=["ascii", "utf8"])
async def test_past_webhook_max_pending_bytes_a_message_is_delivered_but_not_queued(
    text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """flags.md: ``--webhook-max-pending-bytes``: "bytes of frames waiting for their webhooks;
    past it a new message is not queued": "its subscribers get it as always, and it is
    counted (`relay_webhook_not_queued_total`) and logged"."""
    # One message's frame fits in 1,500 bytes, two do not: 1,000 ASCII characters, or 300
    # emoji (1,200 bytes in UTF-8, but 300 characters: the bound counts bytes).
    assert 1000 <= len(text.encode()) <= 1200
    released = threading.Event()
    # Until released, each POST is dropped unanswered: m0 stays waiting for its webhook.
    with WebhookReceiver(lambda n, body: 200 if released.is_set() else -0.05) as receiver:
        running, relay = await start_relay(
            webhooks=(receiver.url,), webhook_max_pending_bytes=1500, **FAST
        )
        async with (
            relay,
            running.connect("/subscribe?channel=c") as subscriber,
            httpx.AsyncClient(base_url=_http(running)) as http,
        ):
            assert (await recv_json(subscriber))["type"] == "subscribed"
            await _publish_text(running, "c", ["m0"], text)
            await _publish_text(running, "c", ["m1"], text)
            got = [await recv_json(subscriber) for _ in range(2)]
            assert [(f["id"], f["text"]) for f in got] == [("m0", text), ("m1", text)]
            full = "webhook outbox full: message 'm1' on 'c' not queued"
            await eventually(lambda: full in caplog.text, what="m1 logged as not queued")
            released.set()
            await eventually(lambda: len(receiver.unique()) == 1, 15, what="m0 delivered")
            # m0 settled: its bytes are free again, and m2 is queued and sent after it. m1,
            # were it queued, would have been sent between them (a channel keeps its order).
            await _publish_text(running, "c", ["m2"], text)
            await eventually(lambda: len(receiver.unique()) == 2, what="m2 delivered")
            assert [p["id"] for p in receiver.unique()] == ["m0", "m2"]

            async def counted() -> bool:
                metrics = (await http.get("/metrics")).text
                return (
                    re.search(r"^relay_webhook_not_queued_total 1\.0$", metrics, re.M) is not None
                )

            await eventually(counted, what="m1 counted in relay_webhook_not_queued_total")
    assert "message 'm0'" not in caplog.text and "message 'm2'" not in caplog.text


# ---------------------------------------------------------------- errors.md: Durable Streams


async def test_a_durable_stream_request_with_a_bad_token_is_401_invalid_token() -> None:
    """errors.md: `invalid_token` 401, "with `--secret`: ... a bad one", as an error frame
    ``{"type": "error", "code": "…", "message": "…"}``."""
    secret = "s" * 32
    running, relay = await start_relay(secret=secret)
    forged = mint("f" * 32, Role.PRODUCE, ["*"], 600)  # signed with another secret
    expired = mint(secret, Role.PRODUCE, ["*"], -60)
    good = mint(secret, Role.PRODUCE, ["*"], 600)
    url = _http(running) + "/v1/stream/chat-1"
    async with relay, httpx.AsyncClient() as client:
        for bad in (forged, expired, "not-a-token", good[:-2]):
            headers = {"Authorization": f"Bearer {bad}", **TEXT}
            refused = await client.put(url, headers=headers)
            assert refused.status_code == 401, bad
            assert refused.headers["content-type"].startswith("application/json")
            body = refused.json()
            assert (body["type"], body["code"]) == ("error", "invalid_token"), body
            assert set(body) == {"type", "code", "message"} and body["message"], body
            read = await client.get(url, params={"offset": "-1", "token": bad})
            assert (read.status_code, read.json()["code"]) == (401, "invalid_token")
        # The refusals made nothing, and a good token is served.
        reader = mint(secret, Role.SUBSCRIBE, ["*"], 600)
        missing = await client.get(url, params={"offset": "-1", "token": reader})
        assert (missing.status_code, missing.json()["code"]) == (404, "stream_not_found")
        made = await client.put(url, headers={"Authorization": f"Bearer {good}", **TEXT})
        assert made.status_code == 201


async def test_a_durable_stream_request_from_an_origin_not_allowed_is_403() -> None:
    """errors.md: `origin_not_allowed` 403, "the browser's `Origin` is not one of
    `--allowed-origin`"."""
    running, relay = await start_relay(allowed_origins=("https://chat.example",))
    url = _http(running) + "/v1/stream/chat-1"
    evil = {"Origin": "https://evil.example", **TEXT}
    async with relay, httpx.AsyncClient() as client:
        for method in ("PUT", "POST", "GET", "HEAD", "DELETE", "OPTIONS"):
            refused = await client.request(method, url, headers=evil)
            assert refused.status_code == 403, method
            if method != "HEAD":
                body = refused.json()
                assert (body["type"], body["code"]) == ("error", "origin_not_allowed"), body
        assert (await client.get(url, params={"offset": "-1"})).status_code == 404  # not made
        good = {"Origin": "https://chat.example", **TEXT}
        made = await client.put(url, headers=good)
        assert made.status_code == 201
        assert made.headers["access-control-allow-origin"] == "https://chat.example"
        assert (await client.put(url, headers=TEXT)).status_code == 200  # no Origin: served


async def test_a_subscription_lease_ttl_ms_is_taken_from_1000_to_600000_only() -> None:
    """errors.md: `INVALID_REQUEST` 400 for "`lease_ttl_ms` out of 1,000 to 600,000", in the
    shape ``{"error": {"code": "…", "message": "…"}}``; a refused request changes nothing."""
    running, relay = await start_relay()
    base = _http(running) + "/v1/stream/__ds/subscriptions/"
    config = {"type": "pull-wake", "streams": ["tasks/1"], "wake_stream": "wakes"}
    async with relay, httpx.AsyncClient() as client:
        for lease in (600_001, 999, 10_000_000):
            refused = await client.put(base + f"s{lease}", json={**config, "lease_ttl_ms": lease})
            assert refused.status_code == 400, lease
            error = refused.json()["error"]
            assert error["code"] == "INVALID_REQUEST" and error["message"], error
            missing = await client.get(base + f"s{lease}")
            assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
        for lease in (600_000, 1_000):
            made = await client.put(base + f"s{lease}", json={**config, "lease_ttl_ms": lease})
            assert made.status_code == 201, (lease, made.text)
            assert (await client.get(base + f"s{lease}")).status_code == 200


async def test_there_are_at_most_1000_durable_subscriptions() -> None:
    """errors.md: `TOO_MANY_SUBSCRIPTIONS` 507, "there are 1,000 subscriptions"."""
    assert MAX_SUBSCRIPTIONS == 1000
    running, relay = await start_relay()
    path = "/v1/stream/__ds/subscriptions/"
    base = _http(running) + path
    config = {"type": "pull-wake", "streams": ["tasks/1"], "wake_stream": "wakes"}
    body = json.dumps(config).encode()
    fields = (("Content-Type", "application/json"), ("Content-Length", str(len(body))))
    puts = [(_request("PUT", f"{path}s{n}", headers=fields), body) for n in range(1000)]
    async with relay, httpx.AsyncClient() as client:
        # Written at once on one connection (HTTP/1.1 pipelining): 1,000 round trips would
        # take seconds on a loaded machine.
        made = await _answers(running, puts)
        assert [status for status, _, _ in made] == [201] * 1000, made[-1]
        refused = await client.put(base + "one-more", json=config)
        assert refused.status_code == 507
        assert refused.json()["error"]["code"] == "TOO_MANY_SUBSCRIPTIONS"
        # One deleted makes room for one.
        assert (await client.delete(base + "s0")).status_code == 204
        assert (await client.put(base + "one-more", json=config)).status_code == 201


# ---------------------------------------------------------------- security.md: CORS


CROSS_ORIGIN_ROUTES = (
    "/sse?channel=c",
    "/cancel",
    "/produce?channel=c",
    "/ai-sdk/c/stream",
    "/ai-sdk/c/stop",
    "/ai-sdk/c/messages",
    "/ai-sdk/c/produce",
)
"""security.md: "The HTTP surfaces a browser may call from another origin (`/sse`,
`/ai-sdk/…`, `/cancel`, `POST /produce`)"."""


def _names(value: str) -> list[str]:
    return [name.strip().lower() for name in value.split(",")]


async def test_a_cors_preflight_gets_the_documented_methods_headers_and_max_age() -> None:
    """security.md: "a preflight `OPTIONS` gets 204 with `GET, POST` and the
    `authorization`, `content-type` and `last-event-id` headers allowed, for 600 s"; a
    response names the request's `Origin` (with `Vary: Origin`); with `--allowed-origin`,
    another origin gets 403 there too."""
    running, relay = await start_relay(allowed_origins=("https://chat.example",))
    origin = "https://chat.example"
    async with relay, httpx.AsyncClient(base_url=_http(running)) as client:
        for path in CROSS_ORIGIN_ROUTES:
            for method in ("GET", "POST"):
                asked = {"Origin": origin, "Access-Control-Request-Method": method}
                preflight = await client.options(path, headers=asked)
                assert preflight.status_code == 204, path
                headers = preflight.headers
                allowed_methods = headers.get_list("access-control-allow-methods")
                allowed_headers = headers.get_list("access-control-allow-headers")
                assert len(allowed_methods) == len(allowed_headers) == 1, path
                assert sorted(_names(allowed_methods[0])) == ["get", "post"], path
                assert sorted(_names(allowed_headers[0])) == [
                    "authorization",
                    "content-type",
                    "last-event-id",
                ], path
                assert headers.get_list("access-control-max-age") == ["600"], path
                assert headers.get_list("access-control-allow-origin") == [origin], path
                assert "origin" in _names(headers["vary"]), path
            evil = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
            refused = await client.options(path, headers=evil)
            assert refused.status_code == 403, path
            assert "access-control-allow-origin" not in refused.headers, path


# ---------------------------------------------------------------- flags.md: --web-root


async def _get(client: httpx.AsyncClient, path: str) -> tuple[int, bytes]:
    response = await client.get(path)
    return response.status_code, response.content


async def test_web_root_serves_at_most_256_files_of_at_most_1_mib_each(tmp_path: Path) -> None:
    """flags.md: ``--web-root`` ... "at most 256 files of 1 MiB each"."""
    assert (MAX_FILES, MAX_FILE_BYTES) == (256, 1024 * 1024)
    many = tmp_path / "many"
    many.mkdir()
    for n in range(257):
        (many / f"f{n:03}.js").write_text(f"export const n = {n};")
    running, relay = await start_relay(web_root=str(many))
    async with relay, httpx.AsyncClient(base_url=_http(running)) as client:
        answers = [await _get(client, f"/f{n:03}.js") for n in range(257)]
    served = [n for n, (status, _) in enumerate(answers) if status == 200]
    assert len(served) == 256
    assert all(answers[n][1] == f"export const n = {n};".encode() for n in served)
    assert [status for status, _ in answers].count(404) == 1
    sizes = tmp_path / "sizes"
    sizes.mkdir()
    (sizes / "whole.js").write_bytes(b"a" * (1024 * 1024))
    (sizes / "over.js").write_bytes(b"b" * (1024 * 1024 + 1))
    running, relay = await start_relay(web_root=str(sizes))
    async with relay, httpx.AsyncClient(base_url=_http(running)) as client:
        assert await _get(client, "/whole.js") == (200, b"a" * (1024 * 1024))
        assert (await _get(client, "/over.js"))[0] == 404


def test_the_documented_numbers_are_printed_where_the_tests_read_them() -> None:
    """The pages this module holds to say what its literals say (a page rewritten with other
    numbers fails here, not silently)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    flags = (docs / "reference" / "flags.md").read_text()
    errors = (docs / "reference" / "errors.md").read_text()
    assert "at most 256 files of 1 MiB each" in flags
    assert "there are 1,000 subscriptions" in errors
    assert "`lease_ttl_ms` out of 1,000 to 600,000" in errors
    security = " ".join((docs / "how-to" / "security.md").read_text().split())
    assert (
        "a preflight `OPTIONS` gets 204 with `GET, POST` and the `authorization`, "
        "`content-type` and `last-event-id` headers allowed, for 600 s"
    ) in security
