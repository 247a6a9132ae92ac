"""Image URLs: fetched from a local aiohttp server within the size limit (whether or not the
server sends a Content-Length), redirects refused, and private addresses refused: 127.0.0.1
is one, so the fetches that must succeed here pass a check that allows it, and the server
started with --allow-image-urls refuses it in the OpenAI envelope."""

from __future__ import annotations

import io
import ipaddress

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image

from appliance.server.errors import APIError
from appliance.server.image_inputs import fetch_image, public_address
from appliance.server.protocol import ImageSource
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client
from tests.support.tiny_processors import gemma3_folder

openai = pytest.importorskip("openai")

LIMIT = 4096


def allow_all(address) -> bool:
    return True


def picture() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), 40).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
async def images_host():
    """A local server: /small.png, /big (sized), /stream (chunked, no length), /moved, /gone."""

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(8):
            await resp.write(b"x" * 1024)
        await resp.write_eof()
        return resp

    async def small(request: web.Request) -> web.Response:
        return web.Response(body=picture())

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * (LIMIT + 1))

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/small.png")

    app = web.Application()
    for path, handler in (("/small.png", small), ("/big", big), ("/stream", stream)):
        app.router.add_get(path, handler)
    app.router.add_get("/moved", moved)
    async with TestServer(app, host="127.0.0.1") as server:
        yield server


def source(server: TestServer, path: str) -> ImageSource:
    return ImageSource("messages[0].content[1].image_url", str(server.make_url(path)))


async def refusal(server: TestServer, path: str, **kwargs) -> str:
    with pytest.raises(APIError) as caught:
        await fetch_image(source(server, path), LIMIT, **kwargs)
    assert caught.value.status == 400
    assert caught.value.param == "messages[0].content[1].image_url"
    return caught.value.message


async def test_a_fetch_within_the_limit_brings_the_bytes(images_host):
    data = await fetch_image(source(images_host, "/small.png"), LIMIT, is_allowed=allow_all)
    assert data == picture()


@pytest.mark.parametrize("path", ["/big", "/stream"])
async def test_a_body_past_the_limit_is_refused(images_host, path):
    message = await refusal(images_host, path, is_allowed=allow_all)
    assert "limit" in message and str(LIMIT) in message
    assert len(await fetch_image(source(images_host, path), 9000, is_allowed=allow_all)) > LIMIT


async def test_redirects_and_missing_images_are_refused(images_host):
    message = await refusal(images_host, "/moved", is_allowed=allow_all)
    assert "redirects are not followed" in message and "/small.png" in message
    assert "HTTP 404" in await refusal(images_host, "/gone", is_allowed=allow_all)


async def test_private_addresses_are_refused_by_default(images_host):
    assert "private" in await refusal(images_host, "/small.png")
    port = images_host.port
    with pytest.raises(APIError, match="private"):  # a name that resolves to loopback
        await fetch_image(ImageSource("x", f"http://localhost:{port}/small.png"), LIMIT)


def test_public_address():
    refused = ["127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "fe80::1"]
    refused += ["::ffff:127.0.0.1", "0.0.0.0", "224.0.0.1", "100.64.0.1", "fd00::1"]
    assert not any(public_address(ipaddress.ip_address(a)) for a in refused)
    assert all(public_address(ipaddress.ip_address(a)) for a in ["8.8.8.8", "2606:4700::1111"])


async def test_the_server_refuses_a_private_url_in_the_openai_envelope(images_host, tmp_path):
    engine = FakeEngine(folder=str(gemma3_folder(tmp_path / "gemma3")))
    async with fake_client(engine, allow_image_urls=True) as client:
        api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0)
        url = str(images_host.make_url("/small.png"))
        parts = [{"type": "text", "text": "w20"}, {"type": "image_url", "image_url": {"url": url}}]
        with pytest.raises(openai.BadRequestError) as caught:
            await api.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": parts}]
            )
        error = caught.value.body
        assert error["param"] == "messages[0].content[1].image_url"
        assert "private, loopback or link-local" in error["message"]
