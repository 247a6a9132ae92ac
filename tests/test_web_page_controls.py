"""The web page in headless Chromium against a scripted fake engine with a normal and an admin
API key: the dashboard's cards hold their content at 1280x800; usage by key shows to the admin
key only; the image control shows for a model that takes images, attaches a PNG as a thumbnail
and sends it as an image_url part (and refuses one too big); deleting a conversation and copying
an answer; and what a first load fetches."""

from __future__ import annotations

import base64
import io
import json
import os
import urllib.request

import pytest

from appliance.web import STATIC_DIR
from tests.support.browser import chromium
from tests.support.fake_engine import FakeEngine
from tests.support.web_server import threaded_server

KEY = "sk-web-normal-0123456789"
ADMIN = "sk-web-admin-0123456789"
ANSWER = "Hello **world**, a scripted answer."
pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000
CANNED_SSE = (
    "".join(
        f"data: {json.dumps(chunk)}\n\n"
        for chunk in (
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "A red "}}]},
            {"choices": [{"index": 0, "delta": {"content": "square."}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        )
    )
    + "data: [DONE]\n\n"
)


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(script=ANSWER, max_model_len=1024)
    settings = {"api_key": [f"web:{KEY}"], "admin_key": [f"boss:{ADMIN}"]}
    with threaded_server(engine, **settings) as url, chromium() as browser:
        yield url, browser


def open_page(server, key: str, **context):
    """A fresh page (its own storage) holding `key`, once the model list is in."""
    url, browser = server
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, **context)
    ctx.add_init_script(f"sessionStorage.setItem('appliance.apiKey', {json.dumps(key)})")
    page = ctx.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    return ctx, page


def goto(page, url: str) -> None:
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready]")
    page.wait_for_function("() => document.querySelector('#model').options.length > 0")


def stats_doc(url: str) -> dict:
    req = urllib.request.Request(f"{url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def png(size: tuple[int, int], noise: bool = False) -> bytes:
    from PIL import Image

    if noise:  # incompressible: the PNG is about as big as its pixels
        image = Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3))
    else:
        image = Image.new("RGB", size, (200, 30, 30))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_no_dashboard_card_overflows_at_1280_wide(server):
    url, _ = server
    doc = stats_doc(url)
    wide = {"p50": 52.08, "p90": 123.45, "p99": 1234.5, "count": 12345}  # the widest figures
    doc["latency"] = {k: wide for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s")}
    body = f"data: {json.dumps(doc)}\n\n"
    ctx, page = open_page(server, ADMIN)
    page.route(
        "**/v1/stats/stream",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=body),
    )
    goto(page, url)
    page.click("#show-dashboard")
    page.wait_for_function(
        "() => document.querySelector('#latency-table tbody').textContent.includes('1235 s')"
    )
    page.wait_for_selector("#keys-table tbody tr")
    overflowing = page.evaluate(
        """() => [...document.querySelectorAll('.card, .table-scroll')]
             .filter(el => el.offsetParent !== null && el.scrollWidth > el.clientWidth)
             .map(el => `${el.closest('.card').querySelector('h2').textContent}: `
                        + `${el.scrollWidth} > ${el.clientWidth}`)"""
    )
    assert overflowing == []
    ctx.close()


def test_usage_by_key_shows_to_an_admin_key_only(server):
    url, _ = server
    shown = {}
    for key in (KEY, ADMIN):
        ctx, page = open_page(server, key)
        goto(page, url)
        page.click("#show-dashboard")
        page.wait_for_function(
            "() => document.querySelector('#requests-table tbody') "
            "&& document.querySelector('#dash-model').textContent.length > 0"
        )
        if key == ADMIN:
            page.wait_for_selector("#keys-table tbody tr")
        shown[key] = (
            page.locator("#keys-section").is_visible(),
            page.locator("#keys-table tbody th").all_text_contents(),
        )
        ctx.close()
    assert shown[KEY] == (False, [])
    visible, names = shown[ADMIN]
    assert visible and {"web", "boss"} <= set(names)


def test_an_attached_image_is_sent_as_an_image_url_part_and_kept(server, tmp_path):
    url, _ = server
    ctx, page = open_page(server, KEY)
    goto(page, url)
    assert page.locator("#attach").is_hidden()  # the fake model takes text only
    assert page.locator("#thinking-setting").is_hidden()  # and does not reason

    def claim_images(route):
        doc = route.fetch().json()
        for card in doc["data"]:
            card["input_modalities"] = ["text", "image"]
        route.fulfill(json=doc)

    sent = []

    def canned_answer(route):
        sent.append(route.request.post_data_json)
        route.fulfill(status=200, content_type="text/event-stream", body=CANNED_SSE)

    page.route("**/v1/models", claim_images)
    page.route("**/v1/chat/completions", canned_answer)
    goto(page, url)
    page.locator("#attach").wait_for(state="visible")

    big = tmp_path / "big.png"
    big.write_bytes(png((700, 700), noise=True))
    page.set_input_files("#attach-file", str(big))
    page.wait_for_function("() => document.querySelector('#notice').textContent.includes('MiB')")
    assert "up to 1 MiB" in page.text_content("#notice")
    assert page.locator("#attachments img").count() == 0

    small = tmp_path / "red.png"
    small.write_bytes(png((32, 24)))
    page.set_input_files("#attach-file", str(small))
    page.locator("#attachments img").wait_for()
    page.fill("#prompt", "What is in the picture?")
    page.click("#send")
    page.wait_for_function(
        "() => (document.querySelector('.message.assistant .stats') || {}).textContent"
    )
    data_url = "data:image/png;base64," + base64.b64encode(small.read_bytes()).decode()
    (body,) = sent
    assert body["messages"][-1]["content"] == [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": data_url}},
    ]
    assert "chat_template_kwargs" not in body  # no thinking switch for a model that does not reason
    assert page.locator("#attachments img").count() == 0
    thumb = page.locator(".message.user .images img")
    assert thumb.get_attribute("src") == data_url
    assert (
        page.evaluate("() => document.querySelector('.message.user .images img').naturalWidth")
        == 32
    )
    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert page.locator(".message.user .images img").get_attribute("src") == data_url
    assert page.text_content(".message.assistant .body").strip() == "A red square."
    ctx.close()


def test_delete_a_conversation_and_copy_an_answer(server):
    url, _ = server
    ctx, page = open_page(server, KEY, permissions=["clipboard-read", "clipboard-write"])
    goto(page, url)
    page.fill("#prompt", "first chat")
    page.click("#send")
    page.wait_for_function(
        "() => !document.body.classList.contains('generating')"
        " && document.querySelector('.message.assistant .stats')?.textContent"
    )
    page.locator(".message.assistant button", has_text="Copy").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == ANSWER
    page.click("#new-chat")
    page.fill("#prompt", "second chat")
    page.click("#send")
    page.wait_for_function("() => document.querySelectorAll('#conversation-list li').length === 2")
    page.wait_for_function("() => !document.body.classList.contains('generating')")
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#conversation-list li.current .delete").click()
    page.wait_for_function("() => document.querySelectorAll('#conversation-list li').length === 1")
    assert page.text_content("#conversation-list li.current .title") == "first chat"
    assert page.locator(".message.user .body").all_text_contents() == ["first chat"]
    stored = page.evaluate("() => JSON.parse(localStorage.getItem('appliance.conversations'))")
    assert [c["title"] for c in stored] == ["first chat"]
    ctx.close()


def test_a_first_load_fetches_each_file_it_needs_once(server):
    url, _ = server
    ctx, page = open_page(server, KEY)
    fetched = []
    page.on("requestfinished", lambda r: fetched.append((r.url[len(url) :], r.sizes())))
    goto(page, url)
    page.wait_for_load_state("networkidle")
    paths = [path for path, _ in fetched]
    static = [p for p in paths if p == "/" or p.startswith("/web/")]
    assert len(static) == len(set(static))  # nothing twice
    assert set(paths) - set(static) <= {"/v1/models"}  # the only API call of a first load
    files = {p[len("/web/") :] for p in static if p != "/"}
    shipped = {str(p.relative_to(STATIC_DIR)) for p in STATIC_DIR.rglob("*") if p.is_file()}
    assert files <= shipped and {"app.css", "js/main.js", "js/attachments.js"} <= files
    body_bytes = sum(sizes["responseBodySize"] for path, sizes in fetched if path in static)
    expected = (STATIC_DIR / "index.html").stat().st_size
    expected += sum((STATIC_DIR / f).stat().st_size for f in files)
    assert body_bytes == expected  # served whole and uncompressed, as counted in the docs
    ctx.close()
