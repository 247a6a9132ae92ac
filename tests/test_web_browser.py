"""The web page in headless Chromium against a real `appliance serve` on the embedded model,
with API keys required: a wrong key is refused on the page and a right one works; an answer
streams in with its figures; stopping a long answer frees its KV on the server; regenerate;
the conversation survives a reload; and the dashboard shows a running request and its KV. The
embedded model neither reasons nor takes images: no thinking switch, no image control."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request

import pytest

from tests.support.browser import chromium
from tests.support.serve_process import start_server

KEY = "sk-web-e2e-0123456789"
MODEL = "SmolLM2-135M-Instruct"
LONG = "Write a very long story about a dragon who learns to cook. Use many chapters."
pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def server_url():
    proc, url = start_server(
        "--max-model-len",
        "512",
        "--num-kv-blocks",
        "64",
        "--api-key",
        f"web:{KEY}",
        "--log-level",
        "warning",
    )
    yield url
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def page(server_url):
    with chromium() as browser:
        page = browser.new_context().new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(server_url + "/")
        page.wait_for_selector("body[data-ready]")
        yield page


def stats(url: str) -> dict:
    req = urllib.request.Request(f"{url}/v1/stats", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def set_field(page, selector: str, value: str) -> None:
    page.locator(".settings").evaluate("d => { d.open = true; }")
    page.fill(selector, value)
    page.dispatch_event(selector, "change")


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.click("#send")


def wait_answered(page, count: int) -> None:
    """Until `count` answers have their figures line (the stream ended)."""
    page.wait_for_function(
        """n => { const s = document.querySelectorAll('.message.assistant .stats');
                  return s.length === n && s[n - 1].textContent.length > 0; }""",
        arg=count,
    )


def test_a_wrong_key_shows_an_error_and_the_right_one_works(page):
    dialog = page.locator("#key-dialog")
    dialog.wait_for(state="visible")
    page.fill("#key-input", "sk-wrong")
    page.click("#key-save")
    page.wait_for_function("() => document.querySelector('#key-error').textContent.length > 0")
    assert "invalid API key" in page.text_content("#key-error")
    assert dialog.is_visible()
    page.fill("#key-input", KEY)
    page.click("#key-save")
    page.wait_for_function("m => document.querySelector('#model').value === m", arg=MODEL)
    assert not dialog.is_visible()


def test_no_thinking_switch_or_image_control_for_the_embedded_model(page):
    card = page.evaluate(
        """async () => (await (await fetch('/v1/models', {headers: {Authorization:
             'Bearer ' + sessionStorage.getItem('appliance.apiKey')}})).json()).data[0]"""
    )
    assert card["reasoning"] is False and card["input_modalities"] == ["text"]
    page.locator(".settings").evaluate("d => { d.open = true; }")
    assert page.locator("#temperature").is_visible()
    assert page.locator("#thinking-setting").is_hidden()
    assert page.locator("#attach").is_hidden()


def test_an_answer_streams_in_with_its_figures(page):
    set_field(page, "#temperature", "0")
    set_field(page, "#max-tokens", "12")
    page.evaluate(
        """() => { window.updates = 0; new MutationObserver(() => window.updates++)
           .observe(document.querySelector('#messages'),
                    {subtree: true, childList: true, characterData: true}); }"""
    )
    send(page, "What is the capital of France?")
    wait_answered(page, 1)
    answer = page.text_content(".message.assistant .body")
    assert "Paris" in answer
    figures = page.text_content(".message.assistant .stats")
    assert "tokens" in figures and "tok/s" in figures and "prompt tokens cached" in figures
    assert page.evaluate("window.updates") > 3  # drawn as the deltas came, not once at the end


def test_stop_ends_a_long_answer_and_the_server_frees_its_kv(page, server_url):
    set_field(page, "#max-tokens", "400")
    send(page, LONG)
    page.wait_for_function(
        "() => (document.querySelectorAll('.message.assistant .body')[1]?.textContent || '')"
        ".length > 0"
    )
    page.click("#stop")
    wait_answered(page, 2)
    assert "stopped" in page.locator(".message.assistant .stats").nth(1).text_content()
    deadline = time.monotonic() + 30
    while True:
        doc = stats(server_url)
        if doc["requests_in_flight"] == 0 and doc["kv"]["blocks_used"] == 0:
            break
        assert time.monotonic() < deadline, (doc["requests_in_flight"], doc["kv"])
        time.sleep(0.1)
    assert doc["requests"][0]["state"] == "cancelled"
    assert doc["requests"][0]["completion_tokens"] < 400


def test_regenerate_replaces_the_last_answer(page, server_url):
    set_field(page, "#max-tokens", "4")
    before = stats(server_url)["counters"]["requests_total"]
    page.click(".message.assistant .regenerate")
    page.wait_for_function("() => !document.body.classList.contains('generating')")
    wait_answered(page, 2)
    assert page.locator(".message.assistant").count() == 2
    assert stats(server_url)["counters"]["requests_total"] == before + 1
    assert "stopped" not in page.locator(".message.assistant .stats").nth(1).text_content()


def test_the_conversation_survives_a_reload(page):
    texts = page.locator(".message .body").all_text_contents()
    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert page.locator(".message .body").all_text_contents() == texts
    assert page.text_content("#conversation-list li.current .title").startswith("What is the")
    page.wait_for_function("m => document.querySelector('#model').value === m", arg=MODEL)


def test_the_dashboard_shows_a_running_request_and_its_kv(page):
    set_field(page, "#max-tokens", "300")
    send(page, LONG)
    page.click("#show-dashboard")
    row = page.locator("#requests-table tbody tr.state-running")
    row.first.wait_for()
    page.wait_for_function("() => Number(document.querySelector('#kv-gauge').ariaValueNow) > 0")
    assert "running" in page.text_content("#queue-text")
    assert page.locator("#keys-section").is_hidden()  # usage by key is for admin keys
    row.first.click()
    page.wait_for_selector("#trace .timeline .mark")
    page.click("#show-chat")
    page.click("#stop")
    page.wait_for_function("() => !document.body.classList.contains('generating')")
