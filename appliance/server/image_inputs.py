"""Images in API requests: where each one came from (ImageSource), its bytes (a data: URL
always; an http(s) URL only under --allow-image-urls, fetched from public addresses only), and
the prompt a chat with images makes through the model's image processor (image_prompt).

Every refusal is a 400 naming the request field the image came from, in the envelope of the
route that failed (OpenAI's, the Responses API's or Anthropic's).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import re
import socket
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from appliance.server.app_keys import EXECUTOR
from appliance.server.errors import bad_request
from appliance.server.protocol import GenerateRequest, ImageSource
from engine.multimodal.images import decode_image
from engine.multimodal.processing import ImageProcessor

if TYPE_CHECKING:
    from appliance.server.state import ServerState

FETCH_TIMEOUT_S = 10.0
"""Longest fetch of one image URL (connection, headers and body)."""
_DATA_URL = re.compile(r"^data:(?P<type>[^,;]*)(?P<params>(?:;[^,;]*)*),(?P<data>.*)$", re.S)
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
HOW_TO_SEND = (
    "send the image as a data URL (data:image/png;base64,...) or start the server with "
    "--allow-image-urls"
)


class RefusedAddress(Exception):
    """An image URL's host resolves to an address the server does not fetch from."""


def public_address(address: IPAddress) -> bool:
    """Whether an image may be fetched from `address`: a global unicast address (no private,
    loopback, link-local, multicast, reserved or unspecified one, IPv4 inside IPv6 included)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a host when any of its addresses fails `is_allowed`: the
    connection goes only to addresses that were checked (no second lookup to rebind)."""

    def __init__(self, is_allowed: Callable[[IPAddress], bool]) -> None:
        self.inner = aiohttp.ThreadedResolver()
        self.is_allowed = is_allowed

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        for result in results:
            if not self.is_allowed(ipaddress.ip_address(result["host"])):
                raise RefusedAddress(f"{host} resolves to {result['host']}")
        return results

    async def close(self) -> None:
        await self.inner.close()


def data_url_bytes(source: ImageSource) -> bytes:
    """The bytes of a base64 data: URL."""
    match = _DATA_URL.match(source.url)
    if match is None or ";base64" not in match["params"].lower():
        raise bad_request(
            f"{source.where} is not a base64 data URL; send data:<media type>;base64,<data>",
            param=source.where,
        )
    try:
        return base64.b64decode(re.sub(r"\s+", "", match["data"]), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            f"{source.where} holds invalid base64 data: send the image's bytes base64-encoded",
            param=source.where,
        ) from None


async def fetch_image(
    source: ImageSource,
    max_bytes: int,
    timeout_s: float = FETCH_TIMEOUT_S,
    is_allowed: Callable[[IPAddress], bool] = public_address,
) -> bytes:
    """The body of an http(s) image URL: at most `max_bytes`, within `timeout_s`, from a host
    whose every address passes `is_allowed` (public_address by default). Redirects are not
    followed: a 3xx is refused, naming where it pointed."""
    where, url = source.where, URL(source.url)

    def refuse(why: str):
        return bad_request(f"{where}: the image at {source.url} {why}", param=where)

    try:
        literal = ipaddress.ip_address(url.host or "")
    except ValueError:
        literal = None
    if literal is not None and not is_allowed(literal):
        raise refuse("is on a private, loopback or link-local address; the server fetches none")
    connector = aiohttp.TCPConnector(resolver=CheckedResolver(is_allowed), force_close=True)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            async with session.get(url, allow_redirects=False) as resp:
                if 300 <= resp.status < 400:
                    to = resp.headers.get("Location", "elsewhere")
                    raise refuse(f"redirects to {to}; redirects are not followed: send that URL")
                if resp.status != 200:
                    raise refuse(f"could not be fetched: HTTP {resp.status}")
                if (resp.content_length or 0) > max_bytes:
                    raise refuse(f"is {resp.content_length} bytes; the limit is {max_bytes}")
                data = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    data += chunk
                    if len(data) > max_bytes:
                        raise refuse(f"is larger than the limit of {max_bytes} bytes")
                return bytes(data)
    except RefusedAddress as exc:
        raise refuse(f"is on a private, loopback or link-local address ({exc})") from None
    except TimeoutError:
        raise refuse(f"did not arrive within {timeout_s:g} s") from None
    except aiohttp.ClientError as exc:
        raise refuse(f"could not be fetched ({type(exc).__name__}: {exc})") from None


async def source_bytes(source: ImageSource, allow_urls: bool, max_bytes: int) -> bytes:
    """An image's bytes: a data: URL decoded, an http(s) URL fetched when `allow_urls`."""
    scheme = source.url.partition(":")[0].lower()
    if scheme == "data":
        return data_url_bytes(source)
    if scheme not in ("http", "https"):
        raise bad_request(
            f"{source.where} must be a data: URL or an http(s) URL; {HOW_TO_SEND}",
            param=source.where,
        )
    if not allow_urls:
        raise bad_request(
            f"{source.where}: this server does not fetch image URLs; {HOW_TO_SEND}",
            param=source.where,
        )
    return await fetch_image(source, max_bytes)


async def image_prompt(app: web.Application, state: ServerState, req: GenerateRequest) -> list:
    """The token ids of a chat with images (req.images, one per {"type": "image"} part of
    req.messages, in order), setting req.image_inputs to one ImageInput per placeholder run."""
    settings, engine, sources = state.settings, state.engine, req.images
    if not engine.takes_images:
        raise bad_request(
            f"{sources[0].where}: the model {state.model_name} takes text only; send the "
            "conversation without images",
            param=sources[0].where,
        )
    limit = settings.max_images_per_request
    if len(sources) > limit:
        where = sources[limit].where
        raise bad_request(
            f"{where}: the request sends {len(sources)} images; this server takes at most "
            f"{limit} a request (--max-images-per-request)",
            param=where,
        )
    allow, max_bytes = settings.allow_image_urls, settings.max_body_bytes
    fetches = [asyncio.ensure_future(source_bytes(s, allow, max_bytes)) for s in sources]
    try:
        blobs = await asyncio.gather(*fetches)
    finally:  # the first refusal answers the request: stop the other fetches
        for fetch in fetches:
            fetch.cancel()
    loop, pool = asyncio.get_running_loop(), app[EXECUTOR]
    images = []
    for i, (source, data) in enumerate(zip(sources, blobs, strict=True)):
        try:
            decode = partial(decode_image, data, i, settings.max_image_pixels)
            images.append(await loop.run_in_executor(pool, decode))
        except ValueError as exc:
            raise bad_request(f"{source.where}: {exc}", param=source.where) from None
    processor = await _processor(state, loop, pool)
    render = partial(processor.render, req.messages, req.tools, req.template_kwargs, images)
    try:
        ids, req.image_inputs = await loop.run_in_executor(pool, render)
    except ValueError as exc:
        raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None
    return ids


async def _processor(state: ServerState, loop, pool) -> ImageProcessor:
    """The model's image processor, loaded at the first request with images."""
    if state.image_processor is None:
        try:
            loaded = await loop.run_in_executor(pool, ImageProcessor.load, state.engine.folder)
        except ValueError as exc:
            raise bad_request(f"this model cannot read images here: {exc}") from None
        if loaded is None:
            raise bad_request(f"the model {state.model_name} takes text only")
        state.image_processor = loaded
    return state.image_processor
