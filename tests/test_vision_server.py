"""Images through a real `appliance serve` on a tiny random Gemma 3 with its processor, driven
by the official openai and anthropic clients: a data-URL image answered, the same image in the
next turn a prefix-cache hit, a different image a miss, the placeholders counted as prompt
tokens, and a bad image a 400 while the server keeps serving."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.support.serve_process import start_server
from tests.support.tiny_served import tiny_gemma3_served

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


def png(color: tuple[int, int, int], size=(40, 30)) -> str:
    """A data URL of a PNG with a coloured square on grey (made here with Pillow)."""
    image = Image.new("RGB", size, (128, 128, 128))
    image.paste(Image.new("RGB", (16, 16), color), (8, 6))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3-served")
    tiny_gemma3_served(folder)
    proc, url = start_server(
        "--model", str(folder), "--max-model-len", "256", "--log-level", "warning"
    )
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def ask(client, image_url: str, text: str, history: list | None = None):
    content = [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": image_url}},
    ]
    messages = [*(history or []), {"role": "user", "content": content}]
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=messages, max_tokens=8, temperature=0
    )


def test_an_image_question_is_answered_and_the_next_turn_hits_the_cache(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=120)
    red = png((255, 0, 0))
    first = ask(client, red, "What colour is the square?")
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.usage.completion_tokens > 0
    text_only = client.chat.completions.create(
        model=first.model,
        messages=[{"role": "user", "content": "What colour is the square?"}],
        max_tokens=8,
        temperature=0,
    )
    assert first.usage.prompt_tokens >= text_only.usage.prompt_tokens + 4  # the placeholders
    history = [
        {"role": "user", "content": [
            {"type": "text", "text": "What colour is the square?"},
            {"type": "image_url", "image_url": {"url": red}},
        ]},
        {"role": "assistant", "content": first.choices[0].message.content},
    ]  # fmt: skip
    again = ask(client, red, "And the background?", history)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16
    other = ask(client, png((0, 0, 255)), "And the background?", [
        {**history[0], "content": [history[0]["content"][0],
                                   {"type": "image_url", "image_url": {"url": png((0, 0, 255))}}]},
        history[1],
    ])  # fmt: skip
    assert other.usage.prompt_tokens_details.cached_tokens < cached


def test_a_bad_image_is_a_400_and_the_server_keeps_serving(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError, match="image"):
        ask(client, "data:image/png;base64,bm90IGFuIGltYWdl", "What is this?")
    assert ask(client, png((0, 255, 0)), "What is this?").usage.completion_tokens > 0


def test_the_anthropic_client_sends_an_image_block(server):
    client = anthropic.Anthropic(base_url=server, api_key="none", max_retries=0, timeout=120)
    data = png((255, 255, 0)).split(",", 1)[1]
    source = {"type": "base64", "media_type": "image/png", "data": data}
    reply = client.messages.create(
        model=openai.OpenAI(base_url=f"{server}/v1", api_key="none").models.list().data[0].id,
        max_tokens=8,
        messages=[{"role": "user", "content": [
            {"type": "image", "source": source},
            {"type": "text", "text": "Describe the image."},
        ]}],
    )  # fmt: skip
    assert reply.usage.output_tokens > 0 and reply.stop_reason in ("end_turn", "max_tokens")


def test_the_responses_api_takes_an_input_image(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    reply = client.responses.create(
        model=model,
        max_output_tokens=8,
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What colour is the square?"},
            {"type": "input_image", "image_url": png((255, 0, 255))},
        ]}],
    )  # fmt: skip
    assert reply.status in ("completed", "incomplete") and reply.usage.output_tokens > 0
    assert reply.usage.input_tokens >= 4  # the image's placeholders count
