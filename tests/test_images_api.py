"""Images in API requests, through the official openai and anthropic clients against a server on
the fake engine whose model folder holds a tiny Gemma 3 processor: every bad image is a 400 in
the API's own envelope naming the field it came from; a text-only model says it takes text
only; count_tokens counts an image as its placeholder tokens; a request's images reach the
engine; and image URLs are fetched within a size limit, never from a private address."""

from __future__ import annotations

import base64
import inspect
import io
from types import SimpleNamespace

import pytest
from PIL import Image

from appliance.server.generation import Choice, Generation
from engine.core.core_client import CoreClient
from engine.multimodal.processing import ImageProcessor
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client
from tests.support.tiny_processors import GEMMA3_TOKENS_PER_IMAGE, gemma3_folder

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

CORE_TAKES_IMAGES = "images" in inspect.signature(CoreClient.add_request).parameters


def png(width: int = 12, height: int = 9, mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), 90).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def chat_with(*urls: str) -> list[dict]:
    parts = [{"type": "text", "text": "w20 look"}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts}]


def openai_sdk(client):
    base = str(client.make_url("/v1"))
    return openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)


def anthropic_sdk(client):
    base = str(client.make_url("")).rstrip("/")
    return anthropic.AsyncAnthropic(base_url=base, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def vision_folder(tmp_path_factory):
    return gemma3_folder(tmp_path_factory.mktemp("gemma3"))


async def openai_refusal(call) -> tuple[str | None, str]:
    with pytest.raises(openai.BadRequestError) as caught:
        await call
    error = caught.value.body
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error"
    return error["param"], error["message"]


async def test_bad_images_are_400s_naming_the_field(vision_folder):
    engine = FakeEngine(folder=str(vision_folder))
    settings = dict(max_images_per_request=2, max_image_pixels=150)
    async with fake_client(engine, **settings) as client:
        api = openai_sdk(client)

        def chat(messages):
            return api.chat.completions.create(model="fake-model", messages=messages)

        good = data_url(png())
        cases = [
            (chat_with(good, "data:image/png;base64,@@not base64@@"), "content[2]", "base64"),
            (chat_with(data_url(b"plain text")), "content[1]", "cannot be decoded"),
            (chat_with(good, good, good), "content[3]", "at most 2 a request"),
            (chat_with(data_url(png(20, 10))), "content[1]", "200 pixels; this server takes at"),
            (chat_with("http://example.com/a.png"), "content[1]", "--allow-image-urls"),
            (chat_with("ftp://example.com/a.png"), "content[1]", "data: URL or an http(s) URL"),
        ]
        for messages, part, words in cases:
            param, message = await openai_refusal(chat(messages))
            assert param == f"messages[0].{part}.image_url", message
            assert words in message and message.startswith(param)
        assistant = [
            *chat_with(good),
            {"role": "assistant", "content": chat_with(good)[0]["content"]},
        ]
        param, message = await openai_refusal(chat(assistant))
        assert param == "messages[1].content[1].image_url" and "user messages" in message
        # the Responses API names its own fields
        image = {"type": "input_image", "image_url": "data:image/png;base64,%%%"}
        items = [{"role": "user", "content": [{"type": "input_text", "text": "w20"}, image]}]
        param, message = await openai_refusal(api.responses.create(model="fake-model", input=items))
        assert param == "input[0].content[1].image_url" and "base64" in message
        items[0]["content"][1] = {"type": "input_image", "file_id": "file-1", "detail": "auto"}
        param, message = await openai_refusal(api.responses.create(model="fake-model", input=items))
        assert param == "input[0].content[1].file_id" and "not supported" in message
        # /tokenize takes text only; the server serves on after every refusal
        r = await client.post("/tokenize", json={"messages": chat_with(good)})
        assert (
            r.status == 400 and "images are not taken here" in (await r.json())["error"]["message"]
        )
        answer = await chat([{"role": "user", "content": "w20 still there?"}])
        assert answer.choices[0].message.content


async def test_anthropic_images_count_and_refuse_in_its_envelope(vision_folder):
    engine = FakeEngine(folder=str(vision_folder))
    async with fake_client(engine) as client:
        api = anthropic_sdk(client)
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png"}}
        good = {**image, "source": {**image["source"], "data": base64.b64encode(png()).decode()}}
        text = {"type": "text", "text": "w20 look"}
        counts = []
        for content in ([text], [text, good], [text, good, good]):
            messages = [{"role": "user", "content": content}]
            r = await api.messages.count_tokens(model="fake-model", messages=messages)
            counts.append(r.input_tokens)
        # what the processor renders: each image adds its soft tokens and their wrapping
        processor = ImageProcessor.load(vision_folder)
        picture = Image.open(io.BytesIO(png()))
        for n in (1, 2):
            parts = [{"type": "text", "text": "w20 look"}] + [{"type": "image"}] * n
            chat = [{"role": "user", "content": parts}]
            ids, inputs = processor.render(chat, None, {"enable_thinking": False}, [picture] * n)
            assert counts[n] == len(ids)
            assert [i.length for i in inputs] == [GEMMA3_TOKENS_PER_IMAGE] * n
        assert counts[2] - counts[1] > GEMMA3_TOKENS_PER_IMAGE

        bad = {**image, "source": {**image["source"], "data": "!!"}}
        url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
        for block, words in ((bad, "invalid base64"), (url, "--allow-image-urls")):
            messages = [{"role": "user", "content": [text, block]}]
            with pytest.raises(anthropic.BadRequestError) as caught:
                await api.messages.create(model="fake-model", max_tokens=8, messages=messages)
            body = caught.value.body
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
            assert body["error"]["message"].startswith("messages[0].content[1].source")
            assert words in body["error"]["message"]


async def test_a_text_only_model_says_so():
    async with fake_client(FakeEngine()) as client:
        param, message = await openai_refusal(
            openai_sdk(client).chat.completions.create(
                model="fake-model", messages=chat_with(data_url(png()))
            )
        )
        assert param == "messages[0].content[1].image_url" and "takes text only" in message
        block = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
        with pytest.raises(anthropic.BadRequestError, match="takes text only"):
            await anthropic_sdk(client).messages.create(
                model="fake-model", max_tokens=8, messages=[{"role": "user", "content": [block]}]
            )


async def test_images_reach_the_engine_and_count_in_usage(vision_folder, monkeypatch):
    handed: dict[str, list] = {}
    if not CORE_TAKES_IMAGES:  # an engine core without images: note them here, send the text
        plain = CoreClient.add_request

        async def add_request(self, request_id, prompt, params, arrival_time=None, images=None):
            handed[request_id] = images
            return await plain(self, request_id, prompt, params, arrival_time)

        monkeypatch.setattr(CoreClient, "add_request", add_request)
    engine = FakeEngine(folder=str(vision_folder))
    async with fake_client(engine) as client:
        api = openai_sdk(client)
        chat = chat_with(data_url(png()), data_url(png(30, 20, "L")))
        with_images = await api.chat.completions.create(
            model="fake-model", messages=chat, max_tokens=4
        )
        text_only = await api.chat.completions.create(
            model="fake-model", messages=chat_with(), max_tokens=4
        )
        urls = [part["image_url"]["url"] for part in chat[0]["content"][1:]]
        parts = [{"type": "input_text", "text": "w20 look"}]
        parts += [{"type": "input_image", "image_url": url} for url in urls]
        response = await api.responses.create(
            model="fake-model", input=[{"role": "user", "content": parts}], max_output_tokens=4
        )
        blocks = [{"type": "text", "text": "w20 look"}]
        for url in urls:
            media_type, _, data = url.removeprefix("data:").partition(";base64,")
            source = {"type": "base64", "media_type": media_type, "data": data}
            blocks.append({"type": "image", "source": source})
        message = await anthropic_sdk(client).messages.create(
            model="fake-model", max_tokens=4, messages=[{"role": "user", "content": blocks}]
        )
    assert with_images.choices[0].message.content
    processor = ImageProcessor.load(vision_folder)
    parts = [{"type": "text", "text": "w20 look"}, {"type": "image"}, {"type": "image"}]
    pictures = [Image.new("RGB", (12, 9)), Image.new("RGB", (30, 20))]
    ids, _ = processor.render([{"role": "user", "content": parts}], None, None, pictures)
    assert with_images.usage.prompt_tokens == len(ids) > text_only.usage.prompt_tokens
    assert response.usage.input_tokens == len(ids)
    read = message.usage.cache_read_input_tokens or 0  # the same prompt: its prefix is cached
    assert message.usage.input_tokens + read == len(ids)
    if not CORE_TAKES_IMAGES:
        sent = list(handed.values())
        assert sent[1] is None  # text alone passes no images
        for images in (sent[0], sent[2], sent[3]):
            assert [(i.length, i.end <= len(ids)) for i in images] == [(4, True), (4, True)]
            assert [i.hash for i in images] == [i.hash for i in sent[0]]


async def test_generation_hands_each_choice_its_images():
    class Engine:
        def __init__(self):
            self.calls = []

        async def add_request(self, request_id, prompt, params, arrival_time=None, **extra):
            self.calls.append((request_id, extra))
            return SimpleNamespace(finished=False)

    engine = Engine()
    record = SimpleNamespace(received_at=0.0, status=None, event=lambda *a, **k: None)
    images = [object()]
    choices = [
        Choice(SimpleNamespace(engine_id="a"), [1, 2], None, images=images),
        Choice(SimpleNamespace(engine_id="b"), [1, 2], None),
    ]
    await Generation(engine, None, record, None, choices).start()
    assert engine.calls == [("a", {"images": images}), ("b", {})]
