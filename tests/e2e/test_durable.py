"""Durable Streams at ``/v1/stream/`` on a real relay, over real sockets: what the protocol's
conformance suite does not hold the relay to (its bounds, tokens, its metrics), and the
documentation's recipe, run as printed."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from token_relay.core.durable import ENTRY_OVERHEAD
from token_relay.core.grants import Role
from token_relay.tokens import mint

from ..conftest import RunningRelay, start_relay
from ..docs.blocks import docs_block
from ..harness import WebhookReceiver, eventually

SECRET = "s" * 32
TEXT = {"Content-Type": "text/plain"}


def _http(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


@asynccontextmanager
async def relay_with(**settings: Any) -> AsyncIterator[RunningRelay]:
    """A relay with ``settings``, stopped on the way out."""
    running, server = await start_relay(**settings)
    async with server:
        yield running


async def test_the_documented_recipe_prints_what_the_page_shows(relay: RunningRelay) -> None:
    port = relay.url.rsplit(":", 1)[1]
    script = re.sub(r"\b8765\b", port, docs_block("durable-curl"))
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err
    assert out.decode() == docs_block("durable-curl-output")


async def test_streams_and_bytes_are_bounded_and_a_refusal_changes_nothing() -> None:
    # Each entry counts its bytes and ENTRY_OVERHEAD: room for one of 10 bytes.
    bounds = {"max_durable_streams": 2, "max_durable_stream_bytes": 10 + ENTRY_OVERHEAD}
    async with relay_with(**bounds) as running:
        base = _http(running) + "/v1/stream/"
        async with httpx.AsyncClient() as client:
            assert (
                await client.put(base + "a", headers=TEXT, content=b"12345678")
            ).status_code == 201
            assert (await client.put(base + "b", headers=TEXT)).status_code == 201
            third = await client.put(base + "c", headers=TEXT)
            assert third.status_code == 507
            assert third.json() == {
                "type": "error",
                "code": "too_many_streams",
                "message": "the relay holds all the streams it may",
            }
            full = await client.post(base + "a", headers=TEXT, content=b"abc")
            assert (full.status_code, full.json()["code"]) == (413, "stream_full")
            read = await client.get(base + "a", params={"offset": "-1"})
            assert read.content == b"12345678"
            assert (await client.delete(base + "b")).status_code == 204
            assert (await client.put(base + "c", headers=TEXT)).status_code == 201
            metrics = (await client.get(_http(running) + "/metrics")).text
    assert re.search(r"^relay_durable_streams 2\.0$", metrics, re.M), metrics
    counted = 8 + ENTRY_OVERHEAD
    assert re.search(rf"^relay_durable_bytes {counted}\.0$", metrics, re.M), metrics


async def test_all_streams_data_counts_in_max_memory_bytes() -> None:
    limit = 12 + 2 * ENTRY_OVERHEAD  # 12 bytes in two entries
    async with relay_with(max_memory_bytes=limit) as running, httpx.AsyncClient() as client:
        base = _http(running) + "/v1/stream/"
        assert (await client.put(base + "a", headers=TEXT, content=b"1234567")).status_code == 201
        assert (await client.put(base + "b", headers=TEXT, content=b"12345")).status_code == 201
        refused = await client.post(base + "b", headers=TEXT, content=b"x")
        assert (refused.status_code, refused.json()["code"]) == (507, "store_full")
        assert (await client.delete(base + "a")).status_code == 204
        assert (await client.post(base + "b", headers=TEXT, content=b"x")).status_code == 204


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **TEXT}


async def test_with_a_secret_reads_and_writes_need_tokens_granting_the_stream() -> None:
    writer = mint(SECRET, Role.PRODUCE, ["chat-*"], 600)
    reader = mint(SECRET, Role.SUBSCRIBE, ["chat-1"], 600)
    async with relay_with(secret=SECRET) as running, httpx.AsyncClient() as client:
        base = _http(running) + "/v1/stream/"
        anonymous = await client.put(base + "chat-1", headers=TEXT)
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "token_required")
        made = await client.put(base + "chat-1", headers=_bearer(writer), content=b"hi")
        assert made.status_code == 201
        elsewhere = await client.put(base + "other", headers=_bearer(writer))
        assert (elsewhere.status_code, elsewhere.json()["code"]) == (403, "forbidden")
        wrong = await client.post(base + "chat-1", headers=_bearer(reader), content=b"x")
        assert (wrong.status_code, wrong.json()["code"]) == (403, "wrong_role")
        read = await client.get(base + "chat-1", params={"offset": "-1", "token": reader})
        assert (read.status_code, read.content) == (200, b"hi")
        not_granted = await client.head(base + "chat-2", headers=_bearer(reader))
        assert not_granted.status_code == 403


async def test_a_long_poll_is_answered_by_the_append_it_waits_for(relay: RunningRelay) -> None:
    base = _http(relay) + "/v1/stream/wait"
    async with httpx.AsyncClient() as client:
        made = await client.put(base, headers={"Content-Type": "application/json"})
        tail = made.headers["stream-next-offset"]
        waiting = asyncio.create_task(
            client.get(base, params={"offset": tail, "live": "long-poll"}, timeout=30)
        )
        # The append is sent once the long-poll is known to wait: its request is counted.
        await eventually(lambda: bool(relay.relay.durable._waiters), what="a waiting long-poll")
        await client.post(base, headers={"Content-Type": "application/json"}, content=b'{"n":1}')
        answer = await waiting
    assert answer.status_code == 200
    assert json.loads(answer.content) == [{"n": 1}]
    assert answer.headers["stream-up-to-date"] == "true"
    assert answer.headers["stream-cursor"].isdigit()


def test_every_durable_refusal_code_is_in_the_errors_page() -> None:
    root = Path(__file__).resolve().parents[2]
    package = root / "server" / "token_relay"
    sources = [
        *(package / "core").glob("durable*.py"),
        *(package / "edge").glob("durable*.py"),
        package / "brokers" / "redis" / "durable.py",
    ]
    raised: set[str] = set()
    for source in sources:
        text = source.read_text()
        raised |= set(re.findall(r'StreamRefused\(\s*\d+,\s*"(\w+)"', text))
        raised |= set(re.findall(r'"(bad_\w+)" if name', text))
    gate = (package / "edge" / "http.py").read_text()
    raised |= set(re.findall(r'_stream_error\(\s*(?:\d+|\w+\.status),\s*"(\w+)"', gate))
    routes = (package / "edge" / "routes.py").read_text()
    raised |= set(re.findall(r'Refusal\(\s*400,\s*"(bad_live|offset_required|bad_path)"', routes))
    page = (root / "docs" / "reference" / "errors.md").read_text()
    section = page[page.index("## Durable Streams refusals") :]
    section = section[: section.index("\n## ")]
    documented = set(re.findall(r"`(\w+)`", section))
    assert len(raised) >= 25, sorted(raised)
    assert raised - documented == set()
    subscription_codes: set[str] = set()
    for name in ("core/durablesubs.py", "edge/durablehooks.py"):
        text = (package / name).read_text()
        subscription_codes |= set(re.findall(r'SubscriptionError\(\s*\d+,\s*"(\w+)"', text))
    assert len(subscription_codes) >= 9, sorted(subscription_codes)
    assert subscription_codes - documented == set()


async def test_a_shutdown_answers_a_waiting_long_poll_at_once() -> None:
    running, server = await start_relay(long_poll_timeout=600.0)
    base = _http(running) + "/v1/stream/quiet"
    async with server, httpx.AsyncClient() as client:
        made = await client.put(base, headers=TEXT)
        waiting = asyncio.create_task(
            client.get(
                base,
                params={"offset": made.headers["stream-next-offset"], "live": "long-poll"},
                timeout=60,
            )
        )
        await eventually(lambda: bool(server.durable._waiters), what="a waiting long-poll")
        await server.stop()
        answer = await waiting
    assert answer.status_code == 204
    assert answer.headers["stream-up-to-date"] == "true"
    assert answer.headers["stream-next-offset"] == made.headers["stream-next-offset"]


async def test_a_text_sse_read_cut_by_its_budget_never_splits_a_character(
    relay: RunningRelay,
) -> None:
    base = _http(relay) + "/v1/stream/accents"
    # Two appends of 600,001 bytes: the second one's characters start at odd offsets, and
    # the first read's budget (1 MiB, even) ends inside one of them.
    text = "é" * 300_000 + "a"
    async with httpx.AsyncClient() as client:
        assert (await client.put(base, headers=TEXT, content=text.encode())).status_code == 201
        more = await client.post(base, headers=TEXT, content=text.encode(), timeout=30)
        assert more.status_code == 204
        await client.post(base, headers={"Stream-Closed": "true"})
        response = await client.get(base, params={"offset": "-1", "live": "sse"}, timeout=30)
    events = [block for block in response.text.split("\n\n") if block.startswith("event: data")]
    assert len(events) == 2
    received = "".join("\n".join(line[5:] for line in block.split("\n")[1:]) for block in events)
    assert received == text * 2


def _verify(signature: str, body: bytes, jwks: dict[str, Any]) -> bool:
    """A ``Webhook-Signature`` checked as a receiver checks it: by its ``kid``'s key."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    fields = dict(part.split("=", 1) for part in signature.split(","))
    (key,) = [key for key in jwks["keys"] if key["kid"] == fields["kid"]]
    public = Ed25519PublicKey.from_public_bytes(
        base64.urlsafe_b64decode(key["x"] + "=" * (-len(key["x"]) % 4))
    )
    signed = base64.urlsafe_b64decode(fields["ed25519"] + "=" * (-len(fields["ed25519"]) % 4))
    try:
        public.verify(signed, f"{fields['t']}.".encode() + body)
    except InvalidSignature:
        return False
    return True


async def test_a_failed_webhook_is_sent_again_signed_then_acked_by_its_callback(
    relay: RunningRelay,
) -> None:
    base = _http(relay) + "/v1/stream/"
    with WebhookReceiver(lambda n, body: 500 if n == 0 else 200) as receiver:
        async with httpx.AsyncClient() as client:
            config = {
                "type": "webhook",
                "pattern": "jobs/*",
                "webhook": {"url": receiver.url},
                "lease_ttl_ms": 60_000,
            }
            made = await client.put(base + "__ds/subscriptions/jobs", json=config)
            assert made.status_code == 201
            jwks = (await client.get(base + "__ds/jwks.json")).json()
            stream = await client.put(base + "jobs/1", headers=TEXT, content=b"work")
            tail = stream.headers["stream-next-offset"]
            await eventually(lambda: len(receiver.received) == 2, timeout=15, what="a retry")
            first, second = receiver.received
            assert (first.status, second.status) == (500, 200)
            assert first.json()["wake_id"] == second.json()["wake_id"]
            assert first.json()["generation"] == second.json()["generation"] == 1
            for post in (first, second):
                assert _verify(post.headers["webhook-signature"], post.body, jwks)
            assert not _verify(second.headers["webhook-signature"], second.body + b" ", jwks)
            wake = second.json()
            assert wake["streams"] == [
                {
                    "path": "jobs/1",
                    "link_type": "glob",
                    "acked_offset": "0000000000000000_0000000000000000",
                    "tail_offset": tail,
                    "has_pending": True,
                }
            ]
            assert wake["callback_url"] == base + "__ds/subscriptions/jobs/callback"
            ack = {
                "wake_id": wake["wake_id"],
                "generation": wake["generation"],
                "acks": [{"stream": "jobs/1", "offset": tail}],
                "done": True,
            }
            bearer = {"Authorization": f"Bearer {wake['callback_token']}"}
            called = await client.post(wake["callback_url"], json=ack, headers=bearer)
            assert (called.status_code, called.json()) == (200, {"ok": True, "next_wake": False})
            again = await client.post(wake["callback_url"], json=ack, headers=bearer)
            assert (again.status_code, again.json()["error"]["code"]) == (409, "FENCED")
            state = (await client.get(base + "__ds/subscriptions/jobs")).json()
    assert state["status"] == "active"
    assert state["streams"] == [
        {"path": "jobs/1", "link_type": "glob", "acked_offset": tail},
    ]
    assert len(receiver.received) == 2


async def test_a_long_poll_on_a_stream_deleted_and_made_again_is_404(relay: RunningRelay) -> None:
    base = _http(relay) + "/v1/stream/again"
    async with httpx.AsyncClient() as client:
        made = await client.put(base, headers=TEXT, content=b"old data")
        waiting = asyncio.create_task(
            client.get(
                base,
                params={"offset": made.headers["stream-next-offset"], "live": "long-poll"},
                timeout=30,
            )
        )
        await eventually(lambda: bool(relay.relay.durable._waiters), what="a waiting long-poll")
        # Deleted and made again before the waiting read runs: it must not read the new one.
        await relay.relay.durable.store.delete("/v1/stream/again", 0.0)
        assert (
            await client.put(base, headers=TEXT, content=b"new data, longer")
        ).status_code == 201
        answer = await waiting
    assert (answer.status_code, answer.json()["code"]) == (404, "stream_not_found")


async def test_location_says_https_only_when_a_trusted_proxy_says_the_client_used_it() -> None:
    https = {"X-Forwarded-Proto": "https", "Host": "relay.example"}
    async with relay_with(trusted_proxies=("127.0.0.1/32",)) as proxied:
        trusted = await _put(proxied, "/v1/stream/behind-tls", https)
    async with relay_with() as direct:
        untrusted = await _put(direct, "/v1/stream/behind-tls", https)
    assert trusted.status_code == untrusted.status_code == 201
    assert trusted.headers["location"] == "https://relay.example/v1/stream/behind-tls"
    assert untrusted.headers["location"] == "http://relay.example/v1/stream/behind-tls"


async def _put(running: RunningRelay, path: str, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=_http(running)) as client:
        return await client.put(path, headers=headers)


async def test_a_stream_seq_too_long_is_400_after_a_missing_stream_is_404(
    relay: RunningRelay,
) -> None:
    base = _http(relay) + "/v1/stream/"
    long_seq = {**TEXT, "Stream-Seq": "s" * 257}
    async with httpx.AsyncClient() as client:
        missing = await client.post(base + "nowhere", headers=long_seq, content=b"x")
        assert (missing.status_code, missing.json()["code"]) == (404, "stream_not_found")
        assert (await client.put(base + "seq", headers=TEXT)).status_code == 201
        long = await client.post(base + "seq", headers=long_seq, content=b"x")
        assert (long.status_code, long.json()["code"]) == (400, "bad_stream_seq")
        fine = await client.post(base + "seq", headers={**TEXT, "Stream-Seq": "s"}, content=b"x")
        assert fine.status_code == 204
        assert fine.headers["Stream-Next-Offset"].endswith("_0000000000000001")
        closed = await client.post(base + "seq", headers={"Stream-Closed": "TRUE"})
        assert closed.status_code == 204
        assert closed.headers["Stream-Closed"] == "true"
