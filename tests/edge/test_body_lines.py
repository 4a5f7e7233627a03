"""An NDJSON body's lines, however its chunks cut it, are the lines of a plain model.

:class:`~token_relay.edge.httpproducer.HttpProducer` splits each chunk's lines at once and
keeps only the line still arriving. Generated bodies (events, blank lines, lines of spaces
and of ``\\r``, invalid UTF-8, lines over ``--max-frame-bytes``, with or without a last
newline), cut into chunks at generated places, must queue what the model says, in order:
each line's text with its size in bytes, nothing for a blank one, and a refusal naming the
line for one over the limit or not UTF-8.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from token_relay.core.errors import ErrorCode, FrameRejected

from tests.edge.test_statuses import ndjson_producer

MAX_LINE = 23

PIECES = [b'{"id":"a","delta":"x"}', b"z" * 10, b" ", b"\r", b"\t", b"\xff", b"\xc3\xa9", b"{}"]


class _Socket:
    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _model(body: bytes) -> list[tuple[Any, ...]]:
    """What the lines of ``body`` queue: (text, size), or (code, line number)."""
    queued: list[tuple[Any, ...]] = []
    for number, line in enumerate(body.split(b"\n"), 1):
        if len(line) > MAX_LINE:
            queued.append((ErrorCode.LINE_TOO_LONG, number))
        elif line and not line.isspace():
            try:
                queued.append((line.decode(), len(line)))
            except UnicodeDecodeError:
                queued.append((ErrorCode.INVALID_JSON, number))
    return queued


@given(
    st.lists(st.lists(st.sampled_from(PIECES), max_size=4).map(b"".join), max_size=12),
    st.booleans(),
    st.lists(st.integers(0, 400), max_size=8),
)
def test_any_chunks_of_a_body_queue_the_lines_of_the_model(
    lines: list[bytes], last_newline: bool, cuts: list[int]
) -> None:
    body = b"\n".join(lines) + (b"\n" if last_newline else b"")
    bounds = sorted({0, len(body), *(cut for cut in cuts if cut < len(body))})
    producer = ndjson_producer(_Socket(), MAX_LINE)
    for start, end in itertools.pairwise(bounds):
        producer.feed(body[start:end])
    producer.end()
    queued = [
        (item.code, item.line) if isinstance(item, FrameRejected) else (item, size)
        for item, size in producer._items
    ]
    assert queued == _model(body)
