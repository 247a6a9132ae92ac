"""An image question through the official openai client against `appliance serve` on a tiny
random Gemma 3 with its processor (tests/support/tiny_served.py): the answer, its usage, and the
next turn with the same image hitting the prefix cache.

    .venv/bin/python results/2026-12-06-cpu-vision/transcript.py
"""

import base64
import io
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openai import OpenAI  # noqa: E402
from PIL import Image  # noqa: E402

from appliance.serve_process import launch_serve  # noqa: E402
from tests.support.tiny_served import tiny_gemma3_served  # noqa: E402


def png() -> str:
    image = Image.new("RGB", (40, 30), (128, 128, 128))
    image.paste(Image.new("RGB", (16, 16), (255, 0, 0)), (8, 6))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def main() -> None:
    folder = Path(tempfile.mkdtemp()) / "tiny-gemma3"
    tiny_gemma3_served(folder)
    proc, url = launch_serve(["--model", str(folder), "--device", "cpu", "--max-model-len", "256"])
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        model = client.models.list().data[0]
        print(
            f"$ GET /v1/models -> {model.id}, input_modalities "
            f"{model.model_extra.get('input_modalities')}\n"
        )
        image = png()
        question = [
            {"type": "text", "text": "What colour is the square?"},
            {"type": "image_url", "image_url": {"url": image}},
        ]
        messages = [{"role": "user", "content": question}]
        for turn in (1, 2):
            reply = client.chat.completions.create(
                model=model.id, messages=messages, max_tokens=12, temperature=0
            )
            shown = json.dumps(messages, indent=1).replace(image, image[:40] + "...")
            print(f"--- turn {turn}: client.chat.completions.create(messages=\n{shown})")
            print(f"answer: {reply.choices[0].message.content!r}")
            print(f"finish_reason: {reply.choices[0].finish_reason}")
            usage = reply.usage
            print(
                f"usage: prompt_tokens {usage.prompt_tokens}, completion_tokens "
                f"{usage.completion_tokens}, cached_tokens "
                f"{usage.prompt_tokens_details.cached_tokens}\n"
            )
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "And the background?"},
            ]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
