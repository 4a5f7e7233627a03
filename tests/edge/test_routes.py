"""The route parser, synchronously: a request's method and target in, its route or refusal out.

Every route, every refusal the parser gives, and every shape of the numeric arguments
(``?rewind=``, ``?wait=``), the channels and percent-encoding, with exact values.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.grants import Grant, Role
from token_relay.core.settings import Settings
from token_relay.edge import http, routes
from token_relay.edge.http import Gate
from token_relay.edge.metrics import Metrics
from token_relay.edge.routes import (
    AiSdkMessages,
    AiSdkProduce,
    AiSdkSocket,
    AiSdkStop,
    AiSdkStream,
    Cancel,
    DeadLetters,
    Health,
    HttpProduce,
    MetricsPage,
    Produce,
    Ready,
    Refusal,
    Sse,
    Static,
    StreamRequest,
    Subscribe,
    cross_origin,
    parse_route,
    seconds_of,
    whole_number,
)

BAD_CHANNEL = Refusal(400, "bad_channel", "?channel= must be 1 to 256 characters")
BAD_REWIND = Refusal(
    400, "bad_rewind", "?rewind= must be a whole number of messages, 1 to 999999999"
)
BAD_WAIT = Refusal(400, "bad_wait", "?wait= must be seconds, 0 to 30")


def route(target: str, method: str = "GET", **facts: object) -> routes.Route | Refusal:
    """The route of a request for ``target`` (a WebSocket handshake unless told)."""
    path, _, query = target.partition("?")
    upgrade = bool(facts.get("upgrade", True))
    last_event_id = str(facts.get("last_event_id", ""))
    return parse_route(method, path, query, upgrade=upgrade, last_event_id=last_event_id)


# ---------------------------------------------------------------------- every route


def test_a_producer_socket() -> None:
    assert route("/produce") == Produce()
    assert route("/produce?channel=c&session=s1&token=t") == Produce(
        token="t", channel="c", session="s1"
    )
    assert route("/produce?session=") == Produce(session=None)


def test_an_http_producer() -> None:
    parsed = route("/produce?channel=c&producer=p&token=t", "POST", upgrade=False)
    assert parsed == HttpProduce(token="t", channel="c", producer="p")
    assert isinstance(parsed, HttpProduce) and parsed.named
    unnamed = route("/produce", "POST", upgrade=False)
    assert unnamed == HttpProduce()
    assert isinstance(unnamed, HttpProduce) and not unnamed.named


def test_a_subscriber_socket() -> None:
    assert route("/subscribe") == Subscribe()
    assert route("/subscribe?channel=a&channel=b&channel=a&deltas=1&rewind=3") == Subscribe(
        channels=("a", "b"), deltas=True, rewind=3
    )


@pytest.mark.parametrize(
    ("given", "deltas"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("On", True),
        ("0", False),
        ("no", False),
        ("", False),
        ("2", False),
    ],
)
def test_deltas_takes_the_usual_forms_of_yes(given: str, deltas: bool) -> None:
    assert route(f"/subscribe?channel=c&deltas={given}") == Subscribe(
        channels=("c",), deltas=deltas
    )


def test_an_sse_stream() -> None:
    parsed = route("/sse?channel=a&channel=b&deltas=on&rewind=2&since=T", upgrade=False)
    assert parsed == Sse(channels=("a", "b"), deltas=True, rewind=2, resume="T")
    # Last-Event-ID (a reconnecting EventSource) wins over ?since=.
    assert route("/sse?channel=a&since=T", last_event_id="L") == Sse(channels=("a",), resume="L")


def test_the_ai_sdk_routes() -> None:
    assert route("/ai-sdk/chat-1/stream") == AiSdkStream(channel="chat-1")
    assert route("/ai-sdk/chat-1/stream?id=m1&wait=2.5&token=t&rewind=2") == AiSdkStream(
        token="t", channel="chat-1", wanted="m1", wait=2.5, rewind=2
    )
    assert route("/ai-sdk/chat-1/stop?id=m1", "POST") == AiSdkStop(channel="chat-1", wanted="m1")
    assert route("/ai-sdk/chat-1/stop?id=", "POST") == AiSdkStop(channel="chat-1", wanted=None)
    # Stop takes no ?wait=: whatever it says is not read.
    assert route("/ai-sdk/c/stop?wait=forever", "POST") == AiSdkStop(channel="c")
    assert route("/ai-sdk/chat-1/produce?id=m1&token=t", "POST") == AiSdkProduce(
        token="t", channel="chat-1", wanted="m1"
    )
    assert route("/ai-sdk/chat%2F1/produce", "POST") == AiSdkProduce(channel="chat/1")
    assert route("/ai-sdk/c/produce") == Refusal(
        405, "method_not_allowed", "/ai-sdk/c/produce takes POST", (("Allow", "POST"),)
    )
    assert route("/ai-sdk/c/produce?id=" + "m" * 257, "POST") == Refusal(
        400, "bad_id", "?id= is at most 256 characters"
    )


def test_the_ai_sdk_websocket_chat_transport() -> None:
    assert route("/ai-sdk/ws", upgrade=True) == AiSdkSocket()
    assert route("/ai-sdk/ws?token=t&token=u", upgrade=True) == AiSdkSocket(token="u")
    assert route("/ai-sdk/ws", upgrade=False) == Refusal(
        426,
        "upgrade_required",
        "/ai-sdk/ws is a WebSocket endpoint: send Upgrade: websocket",
        (("Upgrade", "websocket"), ("Connection", "Upgrade")),
    )
    assert route("/ai-sdk/ws", "POST", upgrade=True) == Refusal(
        405, "method_not_allowed", "/ai-sdk/ws takes GET", (("Allow", "GET"),)
    )
    # A chat named "ws" keeps its stream.
    assert route("/ai-sdk/ws/stream") == AiSdkStream(channel="ws")
    assert cross_origin("GET", "/ai-sdk/ws")


def test_cancel_and_the_dead_letters() -> None:
    assert route("/cancel?token=t", "POST") == Cancel(token="t")
    assert route("/webhooks/dead") == DeadLetters()
    assert route("/webhooks/dead?token=a&token=b", "POST") == DeadLetters(token="b")


def test_the_plain_pages() -> None:
    assert route("/healthz") == Health()
    assert route("/readyz?x=1") == Ready()
    assert route("/metrics", "HEAD") == MetricsPage()
    assert route("/index.html") == Static("/index.html")
    # Whether it exists, and what a method but GET gets there, is the gate's to say.
    assert route("/nothing-here", "DELETE") == Static("/nothing-here")


# ---------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("method", "target", "allowed"),
    [
        ("POST", "/subscribe", "GET"),
        ("PUT", "/produce", "GET"),
        ("HEAD", "/produce", "GET"),
        ("POST", "/sse?channel=c", "GET"),
        ("GET", "/cancel", "POST"),
        ("POST", "/ai-sdk/c/stream", "GET"),
        ("GET", "/ai-sdk/c/stop", "POST"),
    ],
)
def test_a_wrong_method_is_405_naming_the_right_one(method: str, target: str, allowed: str) -> None:
    path = target.partition("?")[0]
    assert route(target, method) == Refusal(
        405, "method_not_allowed", f"{path} takes {allowed}", (("Allow", allowed),)
    )


def test_the_dead_letters_take_get_or_post() -> None:
    assert route("/webhooks/dead", "DELETE") == Refusal(
        405, "method_not_allowed", "/webhooks/dead takes GET or POST", (("Allow", "GET, POST"),)
    )


@pytest.mark.parametrize("path", ["/produce", "/subscribe"])
def test_plain_http_on_a_websocket_endpoint_is_426(path: str) -> None:
    assert route(path, upgrade=False) == Refusal(
        426,
        "upgrade_required",
        f"{path} is a WebSocket endpoint: send Upgrade: websocket",
        (("Upgrade", "websocket"), ("Connection", "Upgrade")),
    )


def test_sse_needs_a_channel() -> None:
    refusal = Refusal(400, "channel_required", "give at least one ?channel=")
    assert route("/sse") == refusal
    assert route("/sse?deltas=1&channels=c") == refusal
    # An empty one is a channel given, and refused for its length (after the address's count).
    assert route("/sse?channel=") == Sse(channels=("",), fault=BAD_CHANNEL)


@pytest.mark.parametrize(
    "path",
    [
        "/ai-sdk/",
        "/ai-sdk/c",
        "/ai-sdk/c/",
        "/ai-sdk/c/resume",
        "/ai-sdk//stream",
        "/ai-sdk/c/stream/more",
        "/ai-sdk/%20x/stream/",
    ],
)
def test_an_ai_sdk_path_of_another_shape_is_404(path: str) -> None:
    assert route(path) == Refusal(
        404, "no_endpoint", "use /ai-sdk/CHANNEL/stream, /stop, /produce or /messages"
    )


def test_the_ai_sdk_messages_route_takes_a_limit() -> None:
    assert route("/ai-sdk/c/messages") == AiSdkMessages(channel="c", limit=1000)
    assert route("/ai-sdk/c/messages?limit=5") == AiSdkMessages(channel="c", limit=5)
    for limit in ("0", "1001", "-1", "x", "1e3"):
        refused = route(f"/ai-sdk/c/messages?limit={limit}")
        assert isinstance(refused, Refusal) and refused.status == 400, limit
    assert route("/ai-sdk/c/messages", "POST") == Refusal(
        405, "method_not_allowed", "/ai-sdk/c/messages takes GET", (("Allow", "GET"),)
    )


def test_an_ai_sdk_channel_is_at_most_256_characters_once_decoded() -> None:
    assert route("/ai-sdk/" + "c" * 256 + "/stream") == AiSdkStream(channel="c" * 256)
    assert route("/ai-sdk/" + "%63" * 256 + "/stream") == AiSdkStream(channel="c" * 256)
    assert route("/ai-sdk/" + "c" * 257 + "/stop", "POST") == Refusal(
        400, "bad_channel", "a channel is 1 to 256 characters"
    )


# ---------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("given", "rewind"), [("1", 1), ("7", 7), ("007", 7), ("999999999", 999999999)]
)
def test_rewind_takes_1_to_9_ascii_digits(given: str, rewind: int) -> None:
    assert route(f"/subscribe?rewind={given}") == Subscribe(rewind=rewind)


@pytest.mark.parametrize(
    "given",
    [
        "",
        "0",
        "000",
        "-1",
        "+1",
        " 1",
        "1.0",
        "1e3",
        "0x10",
        "1234567890",
        "9" * 4300,
        "\u00b2",
        "\u0661",
        "\uff11",
        "%C2%B2",
        "%D9%A1",
    ],
)
def test_rewind_refuses_anything_else(given: str) -> None:
    # Superscript two, Arabic-Indic one and fullwidth one are digits to str.isdigit.
    parsed = route(f"/subscribe?rewind={given}")
    assert isinstance(parsed, Subscribe)
    assert parsed.fault == BAD_REWIND


def test_a_repeated_argument_takes_its_last_value() -> None:
    assert route("/subscribe?rewind=5&rewind=7") == Subscribe(rewind=7)
    bad_last = route("/subscribe?rewind=5&rewind=")
    assert isinstance(bad_last, Subscribe) and bad_last.fault == BAD_REWIND
    good_last = route("/subscribe?rewind=0&rewind=2")
    assert good_last == Subscribe(rewind=2)
    assert route("/produce?session=a&session=b") == Produce(session="b")
    assert route("/ai-sdk/c/stream?wait=5&wait=10&id=a&id=b") == AiSdkStream(
        channel="c", wanted="b", wait=10.0
    )
    # An empty last ?wait= is no wait, and an empty last ?id= names no reply.
    assert route("/ai-sdk/c/stream?wait=5&wait=&id=a&id=") == AiSdkStream(channel="c")


@pytest.mark.parametrize(
    ("given", "wait"),
    [
        ("", 0.0),
        ("0", 0.0),
        ("0.5", 0.5),
        ("1.", 1.0),
        (".5", 0.5),
        ("30", 30.0),
        ("30.000", 30.0),
        ("029", 29.0),
    ],
)
def test_wait_takes_0_to_30_seconds(given: str, wait: float) -> None:
    assert route(f"/ai-sdk/c/stream?wait={given}") == AiSdkStream(channel="c", wait=wait)


@pytest.mark.parametrize(
    "given",
    [
        "30.1",
        "31",
        "-1",
        "nan",
        "inf",
        "1e1",
        "1.2.3",
        ".",
        " 1",
        "+1",
        "1234567890",
        "0.00000001",
        "\u0663",
        "\u00b2",
        "%D9%A3",
    ],
)
def test_wait_refuses_anything_else(given: str) -> None:
    assert route(f"/ai-sdk/c/stream?wait={given}") == BAD_WAIT


def test_the_number_parsers() -> None:
    assert whole_number("123456789") == 123456789
    assert whole_number("1234567890") is None
    assert whole_number("\u0661") is None
    assert whole_number("") is None
    assert seconds_of("2.25", 30) == 2.25
    assert seconds_of("2.25", 2) is None
    assert seconds_of("1e1", 30) is None


# ---------------------------------------------------------------------- channels


def test_channel_length_is_refused_after_the_count_as_the_route_fault() -> None:
    assert route("/subscribe?channel=" + "c" * 256) == Subscribe(channels=("c" * 256,))
    too_long = route("/subscribe?channel=ok&channel=" + "c" * 257)
    assert isinstance(too_long, Subscribe) and too_long.fault == BAD_CHANNEL
    empty = route("/produce?channel=")
    assert isinstance(empty, Produce) and empty.fault == BAD_CHANNEL
    # The channel's fault comes before the rewind's.
    both = route("/cancel?channel=&rewind=0", "POST")
    assert isinstance(both, Cancel) and both.fault == BAD_CHANNEL


def test_a_producer_names_at_most_one_channel() -> None:
    refusal = Refusal(400, "bad_channel", "give at most one ?channel=")
    for parsed in (
        route("/produce?channel=a&channel=b"),
        route("/produce?channel=a&channel=a", "POST", upgrade=False),
    ):
        assert isinstance(parsed, Produce | HttpProduce)
        assert parsed.fault == refusal
        assert parsed.channel == "a"


def test_percent_encoding_is_decoded_once() -> None:
    assert route("/subscribe?channel=a%20b&channel=a+b&channel=%E2%9C%93") == Subscribe(
        channels=("a b", "\u2713")
    )
    assert route("/subscribe?channel=%2525") == Subscribe(channels=("%25",))
    assert route("/ai-sdk/a%2Fb%3F/stream") == AiSdkStream(channel="a/b?")
    # A path's "+" is a plus; a query's is a space.
    assert route("/ai-sdk/a+b/stop?id=x+y", "POST") == AiSdkStop(channel="a+b", wanted="x y")
    # Bytes that are not UTF-8 become U+FFFD, as everywhere in the relay.
    assert route("/subscribe?channel=%FF") == Subscribe(channels=("\ufffd",))
    # The query's length counts characters once decoded: 256 of them fit.
    assert route("/subscribe?channel=" + "%E2%9C%93" * 256) == Subscribe(channels=("\u2713" * 256,))


# ---------------------------------------------------------------------- the rest


@pytest.mark.parametrize(
    ("method", "path", "cross"),
    [
        ("GET", "/sse", True),
        ("OPTIONS", "/cancel", True),
        ("GET", "/ai-sdk/anything", True),
        ("POST", "/produce", True),
        ("OPTIONS", "/produce", True),
        ("GET", "/produce", False),
        ("GET", "/subscribe", False),
        ("GET", "/healthz", False),
    ],
)
def test_the_surfaces_that_answer_cors(method: str, path: str, cross: bool) -> None:
    assert cross_origin(method, path) is cross


def test_routes_are_frozen_values() -> None:
    parsed = Subscribe(channels=("c",))
    with pytest.raises(AttributeError):
        parsed.rewind = 3  # type: ignore[misc]
    assert not hasattr(parsed, "__dict__")  # slots


def test_the_parser_loads_no_loop_no_socket_library() -> None:
    code = "import sys, json, token_relay.edge.routes; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    tops = {name.split(".")[0] for name in loaded}
    assert tops & {"asyncio", "websockets", "h11", "redis", "prometheus_client"} == set()


# ---------------------------------------------------------------------- Durable Streams


def test_a_durable_stream_request_is_named_by_its_whole_path() -> None:
    assert route("/v1/stream/chat/42", "PUT", upgrade=False) == StreamRequest(
        method="PUT", stream="/v1/stream/chat/42"
    )
    assert route(
        "/v1/stream/a?offset=0000000000000000_0000000000000003&live=sse&cursor=7&token=t"
    ) == StreamRequest(
        token="t",
        method="GET",
        stream="/v1/stream/a",
        offset="0000000000000000_0000000000000003",
        live="sse",
        cursor="7",
    )
    parsed = route("/v1/stream/a?offset=-1&live=sse")
    assert isinstance(parsed, StreamRequest) and parsed.sse
    polled = route("/v1/stream/a?offset=now&live=long-poll")
    assert isinstance(polled, StreamRequest) and not polled.sse
    assert route("/v1/stream/a?offset=") == StreamRequest(
        method="GET", stream="/v1/stream/a", offset=""
    )


def test_a_durable_stream_request_is_refused_for_its_query_or_path() -> None:
    assert route("/v1/stream/a?live=sse") == Refusal(
        400, "offset_required", "a live read needs ?offset="
    )
    assert route("/v1/stream/a?offset=-1&live=ws") == Refusal(
        400, "bad_live", "?live= is long-poll or sse"
    )
    too_long = Refusal(400, "bad_path", "a stream's path is /v1/stream/NAME, at most 1024")
    assert route("/v1/stream/") == too_long
    assert route("/v1/stream/" + "x" * 1014) == too_long
    assert isinstance(route("/v1/stream/" + "x" * 1013), StreamRequest)


# ---------------------------------------------------------------------- the gate's routes


def _gate() -> Gate:
    return Gate(Settings(), Metrics(), lambda: True)


TARGET_PARTS = st.sampled_from(
    [
        "/produce", "/subscribe", "/sse", "/cancel", "/ai-sdk/c/stream", "/ai-sdk/c/produce",
        "/ai-sdk/ws", "/v1/stream/s", "/healthz", "/webhooks/dead", "/x",
        "/v1/stream/__ds/jwks.json",
    ]
)  # fmt: skip
QUERIES = st.text(alphabet="channel=&deltas1rewindtokn%2Fwait.s;", max_size=40)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["GET", "POST", "PUT", "HEAD", "OPTIONS", "DELETE"]),
            TARGET_PARTS,
            QUERIES,
            st.booleans(),
            st.sampled_from(["", "3", "c:7", "x" * 600]),
        ),
        max_size=30,
    )
)
@settings(max_examples=200, deadline=None)
def test_the_gate_reuses_a_route_only_for_the_same_request(
    requests: list[tuple[str, str, str, bool, str]],
) -> None:
    """The gate's remembered routes are the parser's, request for request, in any order,
    repeats included: each is equal to a fresh parse of its own arguments."""
    gate = _gate()
    for method, path, query, upgrade, last in requests * 2:
        kept = gate.parse(method, path, query, upgrade=upgrade, last_event_id=last)
        assert kept == parse_route(method, path, query, upgrade=upgrade, last_event_id=last)


def test_the_gate_keeps_a_bounded_number_of_routes_and_no_long_target() -> None:
    gate = _gate()
    long_query = "channel=" + "c" * http.REMEMBERED_TARGET_CHARS
    long = gate.parse("POST", "/produce", long_query)
    assert isinstance(long, HttpProduce) and long.fault is not None  # too long a channel
    assert not gate._routes  # a target over the limit is parsed, never kept
    first = gate.parse("POST", "/produce", "channel=a")
    assert gate.parse("POST", "/produce", "channel=a") is first  # kept: parsed once
    for number in range(http.REMEMBERED_ROUTES * 3):
        assert gate.parse("POST", "/produce", f"channel=c{number}") == HttpProduce(
            channel=f"c{number}"
        )
        assert len(gate._routes) <= http.REMEMBERED_ROUTES
    assert gate.parse("POST", "/produce", "channel=a") == first


@pytest.mark.parametrize("kind", ["reply", "admit", "read"])
def test_cors_adds_its_headers_and_keeps_every_other_field(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cross-origin surface's decision, built again with the CORS headers, is the route's
    decision with them and nothing else changed: every field set to a value of its own."""
    request = http.HttpRequest.of(
        "POST", "/produce?channel=c", [("Origin", "https://chat.example")], "10.0.0.1", ()
    )
    grant = Grant(Role.PRODUCE, ("c",))
    decision: http.Reply | http.Admit | http.ReadBody
    if kind == "reply":
        decision = http.Reply(418, b"body", "text/x-test", (("X-Own", "1"),))
    elif kind == "admit":
        route = routes.Sse(channels=("c",))
        decision = http.Admit(request, route, grant, {"c": (3, "E")}, (("X-Own", "1"),))
    else:
        gone = cast("asyncio.Future[None]", object())
        route = routes.HttpProduce(channel="c")
        decision = http.ReadBody(request, route, grant, (("X-Own", "1"),), gone)
    gate = _gate()
    monkeypatch.setattr(gate, "_route", lambda _: decision)
    cors = (("Access-Control-Allow-Origin", "https://chat.example"), ("Vary", "Origin"))
    headers = decision.headers + cors if kind == "reply" else cors
    assert gate.route(request) == dataclasses.replace(decision, headers=headers)
