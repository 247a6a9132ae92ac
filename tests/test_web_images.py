"""The web page's image control against a real `appliance serve` on a tiny random Gemma 3 that
reads images: the control shows from the server's own /v1/models entry, an attached PNG is
answered, its placeholders count as prompt tokens, and the next turn (which sends the image
again) finds that prompt in the prefix cache."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from tests.support.browser import chromium
from tests.support.serve_process import start_server
from tests.support.tiny_served import tiny_gemma3_served

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3-web")
    tiny_gemma3_served(folder)
    proc, url = start_server(
        *["--model", str(folder), "--max-model-len", "256", "--block-size", "16"],
        *["--log-level", "warning"],
    )
    try:
        with chromium() as browser:
            page = browser.new_context().new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url + "/")
            page.wait_for_selector("body[data-ready]")
            yield page
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def answer(page, text: str, count: int) -> tuple[int, int]:
    """Send `text`; (cached, prompt) tokens from the figures under answer number `count`."""
    page.fill("#prompt", text)
    page.click("#send")
    page.wait_for_function(
        """n => { const s = document.querySelectorAll('.message.assistant .stats');
                  return s.length === n && s[n - 1].textContent.length > 0; }""",
        arg=count,
    )
    figures = page.locator(".message.assistant .stats").nth(count - 1).text_content()
    match = re.search(r"(\d+) of (\d+) prompt tokens cached", figures)
    assert match, figures
    return int(match.group(1)), int(match.group(2))


def test_an_attached_image_is_answered_and_the_next_turn_hits_the_cache(page, tmp_path):
    page.locator("#attach").wait_for(state="visible")  # the server says the model reads images
    image = Image.new("RGB", (40, 30), (128, 128, 128))
    image.paste(Image.new("RGB", (16, 16), (255, 0, 0)), (8, 6))
    path = tmp_path / "square.png"
    image.save(path, format="PNG")
    page.locator(".settings").evaluate("d => { d.open = true; }")
    page.fill("#max-tokens", "4")
    page.dispatch_event("#max-tokens", "change")
    page.set_input_files("#attach-file", str(path))
    page.locator("#attachments img").wait_for()
    _, with_image = answer(page, "What colour is the square?", 1)
    assert page.locator(".message.user .images img").count() == 1
    page.click("#new-chat")
    _, text_only = answer(page, "What colour is the square?", 1)
    assert with_image > text_only  # the image's placeholders count as prompt tokens
    page.locator("#conversation-list li .title").nth(1).click()  # back to the image chat
    page.locator(".message.user .images img").wait_for()
    cached, prompt = answer(page, "Are you sure?", 2)
    # more cached than any text-only prefix could give: the image's own blocks hit the cache
    assert prompt > with_image and cached > text_only
