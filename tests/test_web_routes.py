"""The web page's routes without a browser: GET / and its files with a Content-Security-Policy
that admits only the page's own scripts, the right content types, --no-web, the page open while
the API wants a key, CORS off unless an origin is named, the vendored libraries with their
licences, the refresher's integrity check, and `appliance top --web`: its command, and the real
thing answering its page and drawing the dashboard over its websocket. Also what the
page reads of the server: /v1/key (admin or not), the models' `reasoning` and `input_modalities`,
and /openapi.json without the page's routes under --no-web."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import re
import shlex
import socket
import sys
import tarfile
import time
from dataclasses import replace
from html.parser import HTMLParser

import aiohttp
import pytest

from appliance.cli import build_parser
from appliance.server.web_routes import CONTENT_SECURITY_POLICY
from appliance.web import STATIC_DIR, VENDOR_DIR
from appliance.web.vendor_refresh import PINS, unpack
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client
from tui.browser import API_KEY_ENV, top_command

KEY = "sk-web-0123456789"
ORIGIN = "http://lan-box.example:3000"


def static_files() -> list[str]:
    return sorted(str(p.relative_to(STATIC_DIR)) for p in STATIC_DIR.rglob("*") if p.is_file())


async def test_the_page_and_its_files_carry_the_policy_and_their_content_types():
    async with fake_client() as client:
        r = await client.get("/")
        assert r.status == 200 and r.content_type == "text/html"
        policy = r.headers["Content-Security-Policy"]
        assert policy == CONTENT_SECURITY_POLICY
        directives = dict(d.split(" ", 1) for d in policy.split("; "))
        assert directives["script-src"] == "'self'" and "unsafe" not in policy
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        expected = {
            "app.css": "text/css",
            "js/main.js": "text/javascript",
            "vendor/dompurify/purify.es.mjs": "text/javascript",
            "vendor/highlight/github-dark.min.css": "text/css",
            "vendor/marked/LICENSE": "text/plain",
        }
        for path, content_type in expected.items():
            r = await client.get(f"/web/{path}")
            assert r.status == 200 and r.content_type == content_type, path
            assert r.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert await r.read() == (STATIC_DIR / path).read_bytes()
        for outside in ("/web/../__init__.py", "/web/%2e%2e/__init__.py", "/web/nothing.js"):
            r = await client.get(outside)
            assert r.status == 404, outside


class Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict] = []
        self.handlers: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts.append(attrs)
        self.handlers += [name for name in attrs if name.startswith("on")]


def test_the_page_has_no_inline_script_and_loads_only_files_it_ships():
    html = (STATIC_DIR / "index.html").read_text()
    parser = Scripts()
    parser.feed(html)
    assert parser.scripts and all(s.get("src") for s in parser.scripts)
    assert parser.handlers == []
    shipped = set(static_files())
    linked = re.findall(r'(?:src|href)="/web/([^"]+)"', html)
    for path in (STATIC_DIR / "js").glob("*.js"):
        linked += re.findall(r'from "/web/([^"]+)"', path.read_text())
        assert "eval(" not in path.read_text() and "innerHTML" not in path.read_text(), path
    assert linked and set(linked) <= shipped


async def test_no_web_answers_404_as_before():
    async with fake_client(web=False) as client:
        assert (await client.get("/")).status == 404
        assert (await client.get("/web/js/main.js")).status == 404
        assert (await client.get("/health")).status == 200


async def test_no_web_leaves_the_pages_routes_out_of_openapi():
    async with fake_client(web=False) as client:
        spec = await (await client.get("/openapi.json")).json()
        routes = {
            (r.resource.canonical, r.method.lower())
            for r in client.app.router.routes()
            if r.method != "HEAD"
        }
        documented = {(p, m) for p, ops in spec["paths"].items() for m in ops}
        assert routes == documented
        assert not {"/", "/web/{path}", "/v1/key"} & set(spec["paths"])
        assert "/v1/chat/completions" in spec["paths"]
        assert (await client.get("/v1/key")).status == 404
    async with fake_client() as client:
        spec = await (await client.get("/openapi.json")).json()
        assert {"/", "/web/{path}", "/v1/key"} <= set(spec["paths"])


async def test_v1_key_says_whether_the_key_is_an_admin_key():
    admin = "sk-admin-0123456789"
    async with fake_client(api_key=[f"web:{KEY}"], admin_key=[f"boss:{admin}"]) as client:
        assert (await client.get("/v1/key")).status == 401
        bad = await client.get("/v1/key", headers={"Authorization": "Bearer sk-nope"})
        assert bad.status == 401
        r = await client.get("/v1/key", headers={"Authorization": f"Bearer {KEY}"})
        assert await r.json() == {"auth": True, "name": "web", "admin": False}
        r = await client.get("/v1/key", headers={"Authorization": f"Bearer {admin}"})
        assert await r.json() == {"auth": True, "name": "boss", "admin": True}
    async with fake_client() as client:
        r = await client.get("/v1/key")
        assert await r.json() == {"auth": False, "name": None, "admin": False}


@pytest.mark.parametrize("template,reasons", [("role: content", False), ("{{ m }} <think>", True)])
async def test_models_say_whether_they_reason_and_take_text(template, reasons):
    async with fake_client(FakeEngine(chat_template=template)) as client:
        (card,) = (await (await client.get("/v1/models")).json())["data"]
        assert card["reasoning"] is reasons
        assert card["input_modalities"] == ["text"]
        one = await (await client.get(f"/v1/models/{card['id']}")).json()
        assert one["reasoning"] is reasons and one["input_modalities"] == ["text"]


async def test_a_model_that_reads_images_says_so(tmp_path):
    (tmp_path / "config.json").write_text('{"vision_config": {}, "image_token_id": 7}')
    async with fake_client(FakeEngine(folder=str(tmp_path))) as client:
        (card,) = (await (await client.get("/v1/models")).json())["data"]
        assert card["input_modalities"] == ["text", "image"]


async def test_the_page_opens_without_a_key_and_the_api_still_wants_one():
    async with fake_client(api_key=[f"web:{KEY}"]) as client:
        assert (await client.get("/")).status == 200
        assert (await client.get("/web/js/api.js")).status == 200
        assert (await client.get("/v1/models")).status == 401
        r = await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status == 200


async def test_cors_is_off_unless_an_origin_is_named():
    async with fake_client() as client:
        for path in ("/", "/v1/models"):
            r = await client.get(path, headers={"Origin": ORIGIN})
            assert "Access-Control-Allow-Origin" not in r.headers, path
    async with fake_client(cors_origin=[ORIGIN]) as client:
        r = await client.get("/v1/models", headers={"Origin": ORIGIN})
        assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
        r = await client.get("/v1/models", headers={"Origin": "http://other.example"})
        assert "Access-Control-Allow-Origin" not in r.headers
        pre = await client.options(
            "/v1/chat/completions",
            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
        )
        assert pre.status == 204 and "Authorization" in pre.headers["Access-Control-Allow-Headers"]


def test_cors_origin_repeats_and_web_turns_off_on_the_command_line():
    args = build_parser().parse_args(
        ["serve", "--no-web", "--cors-origin", ORIGIN, "--cors-origin", "http://b.example"]
    )
    assert args.web is False and args.cors_origin == [ORIGIN, "http://b.example"]


@pytest.mark.parametrize("pin", PINS, ids=lambda p: p.name)
def test_each_vendored_library_is_its_pinned_release_with_its_licence(pin):
    folder = VENDOR_DIR / pin.folder
    assert (folder / "VERSION").read_text().split() == [pin.name, pin.version]
    for name in pin.files.values():
        assert (folder / name).stat().st_size > 0, name
    licences = [n for n in pin.files.values() if n.startswith("LICENSE")]
    assert licences and all((folder / n).read_text().strip() for n in licences)


def tarball(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_the_refresher_takes_only_a_tarball_matching_its_pin():
    data = tarball({"dist/a.js": b"export default 1;", "LICENSE": b"MIT"})
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    pin = replace(PINS[0], integrity=digest, files={"dist/a.js": "a.js", "LICENSE": "LICENSE"})
    assert unpack(pin, data) == {"a.js": b"export default 1;", "LICENSE": b"MIT"}
    with pytest.raises(ValueError, match="pinned sha512"):
        unpack(replace(pin, integrity=PINS[1].integrity), data)


def test_top_web_runs_appliance_top_per_page_without_the_key_on_its_command_line():
    args = build_parser().parse_args(["top", "--web", "--api-key", KEY, "--web-port", "9001"])
    assert args.web and args.web_port == 9001 and args.web_host == "127.0.0.1"
    argv = shlex.split(top_command("http://127.0.0.1:8000", verify_tls=False))
    assert argv[1:] == [
        "-m",
        "appliance",
        "top",
        "--url",
        "http://127.0.0.1:8000",
        "--no-verify-tls",
    ]
    assert KEY not in " ".join(argv)


def test_top_web_hands_textual_serve_the_command_and_the_key_in_the_environment(monkeypatch):
    from textual_serve.server import Server

    from appliance.cli import main

    served = []
    monkeypatch.setattr(Server, "serve", lambda self, debug=False: served.append(self))
    monkeypatch.setenv(API_KEY_ENV, "")  # restored after the test
    assert main(["top", "--web", "--api-key", KEY, "--web-host", "0.0.0.0"]) == 0
    (server,) = served
    assert server.command.endswith("appliance top --url http://127.0.0.1:8000")
    assert (server.host, server.port) == ("0.0.0.0", 8001)
    assert not server.public_url.startswith("http://0.0.0.0")
    assert os.environ[API_KEY_ENV] == KEY


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_top_web_answers_its_page_and_draws_the_dashboard_over_its_websocket():
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "appliance", "top", "--web", "--web-port", str(port)],
        *["--url", f"http://127.0.0.1:{free_port()}"],  # no appliance there: it says so
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with session.get(base + "/") as resp:
                        page = await resp.text()
                        break
                except aiohttp.ClientConnectionError:
                    assert proc.returncode is None and time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            assert resp.status == 200
            assert f'data-session-websocket-url="ws://127.0.0.1:{port}/ws"' in page
            async with session.get(base + "/static/js/textual.js") as resp:
                assert resp.status == 200 and len(await resp.read()) > 1000
            screen = ""
            async with session.ws_connect(base + "/ws?width=100&height=30") as ws:
                while "DISCONNECTED" not in screen:  # `appliance top` ran and drew its header
                    msg = await ws.receive(timeout=30)
                    assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), msg
                    data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                    screen += data.decode(errors="replace")
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
