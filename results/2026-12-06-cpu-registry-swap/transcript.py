"""Three models in one registry (chat, embedding, rerank) under a memory cap that holds two: a
chat, an embedding and a rerank call, the swap the cap forces, /v1/models before and after.

    .venv/bin/python results/2026-12-06-cpu-registry-swap/transcript.py > transcript-body.md
"""

import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from appliance.server import create_app  # noqa: E402
from appliance.server.app_keys import STATE  # noqa: E402
from appliance.server.state import Phase  # noqa: E402
from appliance.settings import ServeSettings  # noqa: E402
from engine.models.embedded import default_model_path  # noqa: E402
from tests.support.tiny_embed import make_tiny_embedder, make_tiny_reranker  # noqa: E402

CARD_FIELDS = ("id", "status", "kind", "memory_bytes", "input_modalities")
CHAT = {
    "model": "chat",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 12,
    "temperature": 0,
}
EMBED = {"model": "embed", "input": ["first document", "second document"]}
RERANK = {
    "model": "rerank",
    "query": "capital of France",
    "documents": ["Paris is in France.", "Bananas are yellow."],
    "top_n": 2,
}


def show(title: str, method: str, path: str, body, status: int, reply) -> None:
    sent = f"\n{json.dumps(body)}" if body else ""
    print(f"### {title}\n\n```\n$ {method} {path}{sent}\n-> {status}")
    print(f"{json.dumps(reply, indent=1)[:1500]}\n```\n")


async def main() -> None:
    root = Path(tempfile.mkdtemp())
    models = [
        f"chat={default_model_path()}",
        f"embed={make_tiny_embedder(root / 'tiny-qwen3-embedding')}",
        f"rerank={make_tiny_reranker(root / 'tiny-qwen3-reranker')}",
    ]
    settings = ServeSettings(
        model=models, models_memory=1.025e9 / 2**30, device="cpu", warmup=False,
        max_model_len=512, log_level="warning",
    )  # fmt: skip
    app = create_app(settings)
    async with TestClient(TestServer(app)) as client:
        while app[STATE].phase is not Phase.READY:
            await asyncio.sleep(0.05)

        async def call(title: str, method: str, path: str, body=None) -> None:
            resp = await (client.post(path, json=body) if body else client.get(path))
            reply = await resp.json()
            if path == "/v1/models":
                reply = [{k: m[k] for k in CARD_FIELDS if k in m} for m in reply["data"]]
            for item in reply.get("data", []) if isinstance(reply, dict) else []:
                if "embedding" in item:
                    item["embedding"] = item["embedding"][:4] + ["..."]
            show(title, method, path, body, resp.status, reply)

        await call("/v1/models at start", "GET", "/v1/models")
        await call("A chat", "POST", "/v1/chat/completions", CHAT)
        await call("An embedding", "POST", "/v1/embeddings", EMBED)
        await call("/v1/models: chat and embed loaded (the cap holds both)", "GET", "/v1/models")
        title = "A rerank: the least recently used model (chat) is unloaded to make room"
        await call(title, "POST", "/v1/rerank", RERANK)
        await call("/v1/models after the swap", "GET", "/v1/models")


if __name__ == "__main__":
    asyncio.run(main())
