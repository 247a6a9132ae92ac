"""The web page in headless Chromium against a scripted fake engine whose answers and reasoning
carry HTML that would run script (`<script>`, `<img onerror>`, `<svg onload>`, a javascript:
link): nothing runs, nothing is even attempted against the page's Content-Security-Policy, and
the text shows as written. Also edit-and-resend, conversations through export and import, the
thinking switch of a model that reasons, and no usage by key on a server without keys."""

from __future__ import annotations

import json

import pytest

from tests.support.browser import chromium
from tests.support.fake_engine import FakeEngine
from tests.support.web_server import threaded_server

ATTACKS = (
    '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
    '<svg onload="window.pwned=3"></svg> [click](javascript:window.pwned=4)'
)
SCRIPT = (
    f"<think>thinking {ATTACKS}</think>\n\nAnswer: **bold** {ATTACKS}\n\n```js\nlet a = 1;\n```\n"
)
pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def page():
    engine = FakeEngine(script=SCRIPT, chat_template="{{ messages }} <think>", max_model_len=1024)
    with threaded_server(engine) as url, chromium() as browser:
        page = browser.new_context().new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url + "/")
        page.evaluate(
            """() => { window.violations = [];
               document.addEventListener('securitypolicyviolation',
                 e => window.violations.push(e.violatedDirective)); }"""
        )
        page.wait_for_selector("body[data-ready]")
        yield page


def answer(page, text: str, count: int) -> None:
    page.fill("#prompt", text)
    page.click("#send")
    page.wait_for_function(
        """n => { const s = document.querySelectorAll('.message.assistant .stats');
                  return s.length === n && s[n - 1].textContent.length > 0; }""",
        arg=count,
    )


def test_the_thinking_switch_shows_for_a_model_that_reasons(page):
    page.wait_for_function("() => document.querySelector('#model').options.length > 0")
    page.locator(".settings").evaluate("d => { d.open = true; }")
    assert page.locator("#thinking-setting").is_visible()
    assert page.locator("#attach").is_hidden()


def test_model_html_runs_nothing_and_shows_as_text(page):
    answer(page, "w5 w6", 1)
    message = page.locator(".message.assistant").first
    assert page.evaluate("() => window.pwned") is None
    assert page.evaluate("() => window.violations") == []
    body = message.locator(".body")
    assert "<script>window.pwned=2</script>" in body.text_content()
    assert '<img src=x onerror="window.pwned=1">' in body.text_content()
    assert body.locator("strong").text_content() == "bold"
    assert body.locator("code.hljs").count() == 1  # the code block is highlighted
    dangerous = "script, img, svg, [onerror], [onload], a[href^='javascript']"
    assert page.locator(f"#messages :is({dangerous})").count() == 0
    reasoning = message.locator("details.reasoning")
    assert reasoning.is_visible() and reasoning.get_attribute("open") is None
    assert "<script>window.pwned=2</script>" in reasoning.text_content()


def test_edit_and_resend_replaces_the_rest_of_the_conversation(page):
    page.locator(".message.user button", has_text="Edit").first.click()
    page.fill(".editor textarea", "w7 edited")
    page.click(".editor .send-edit")
    page.wait_for_function(
        """() => !document.body.classList.contains('generating')
                 && document.querySelectorAll('.message').length === 2"""
    )
    assert page.locator(".message.user .body").all_text_contents() == ["w7 edited"]
    assert page.locator(".message.assistant .stats").text_content()


def test_conversations_export_and_import(page, tmp_path):
    with page.expect_download() as download:
        page.click("#export-chats")
    path = tmp_path / "conversations.json"
    download.value.save_as(path)
    doc = json.loads(path.read_text())
    assert [m["role"] for m in doc["conversations"][0]["messages"]] == ["user", "assistant"]
    page.set_input_files("#import-file", str(path))
    page.locator("#conversation-list li").nth(1).wait_for()
    assert "imported 1 conversation" in page.text_content("#notice")
    page.on("dialog", lambda dialog: dialog.accept("renamed"))
    page.locator("#conversation-list li .rename").first.click()
    assert "renamed" in page.locator("#conversation-list").text_content()


def test_no_usage_by_key_on_a_server_without_keys(page):
    page.click("#show-dashboard")
    page.wait_for_function("() => document.querySelector('#dash-model').textContent.length > 0")
    assert page.locator("#keys-section").is_hidden()
    assert page.locator("#keys-table tbody tr").count() == 0
    page.click("#show-chat")
