"""The one Server-Sent Events parser the dashboard and the load generator share (tui/sse.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tui.sse import SSEParser, events

STREAM = (
    ": a comment, then an event in two data lines\n"
    'data: {"a":\n'
    "data:1}\n"
    "\n"
    "event: ignored\n"
    "id: 7\n"
    "data:  two spaces keep one\n"
    "\n"
    "data\n"
    "\n"
    "data: é ü 漢字\n"
    "\n"
    "data: [DONE]\n"
    "\n"
    "data: never ended"
).encode()
EXPECTED = ['{"a":\n1}', " two spaces keep one", "é ü 漢字", "[DONE]"]


def parse(pieces: list[bytes]) -> list[str]:
    parser = SSEParser()
    return [data for piece in pieces for data in parser.feed(piece)]


def test_whole_stream():
    assert parse([STREAM]) == EXPECTED


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"])
def test_crlf_and_cr_line_ends(newline):
    assert parse([STREAM.replace(b"\n", newline)]) == EXPECTED


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_split_into_two_and_byte_by_byte(newline):
    stream = STREAM.replace(b"\n", newline)
    for cut in range(len(stream) + 1):
        assert parse([stream[:cut], stream[cut:]]) == EXPECTED, (newline, cut)
    assert parse([stream[i : i + 1] for i in range(len(stream))]) == EXPECTED


def test_a_crlf_split_between_reads_is_one_line_end():
    # "a" and "b" are one event: the CR at the end of a read must not end a line on its own
    assert parse([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]) == ["a\nb"]


class Body:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def iter_any(self):
        for piece in self.pieces:
            yield piece


async def test_events_stop_at_done():
    body = Body([STREAM[:40], STREAM[40:]])
    assert [data async for data in events(body)] == EXPECTED[:-1]
    assert [data async for data in events(Body([b"data: x\n\ndata: y\n"]))] == ["x"]


def test_the_load_generator_reads_streams_without_loading_the_dashboard():
    code = (
        "import sys, appliance.loadgen.client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'torch', 'engine'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
