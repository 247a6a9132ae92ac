"""Multi-turn conversations and prefix-cache accounting in the load generator, against a fake
in-process OpenAI server that records every body it receives, streams an answer that depends
on the whole history, reports cached tokens in its usage (chat) or leaves them out
(completions), and counts them in /v1/stats."""

from __future__ import annotations

import asyncio
import json
import zlib

from aiohttp import web
from aiohttp.test_utils import TestServer

from appliance.loadgen import SLO, ClientConfig, LengthDist, LoadSession, Stage, WorkloadSpec
from appliance.loadgen.agent import AGENT_TOOLS
from appliance.loadgen.report import summarize


class FakeOpenAI:
    """One token per word. Chat answers are `max_tokens` words drawn from a hash of the
    messages; a chat usage counts as cached every token ahead of the last question (a prefix
    cache that kept the whole history). `fail_turn`: the first request of that turn answers
    500."""

    def __init__(self, fail_turn: int | None = None) -> None:
        self.bodies: list[dict] = []
        self.answers: list[str] = []
        """The answer streamed for each chat body, in the same order."""
        self.fail_turn = fail_turn
        self.inflight = self.max_inflight = 0
        self.counters = dict.fromkeys(
            ("generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total"), 0
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/v1/stats", self.stats)
        return app

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"engine": {**self.counters, "prefix_caching": True}})

    async def tokenize(self, request: web.Request) -> web.Response:
        words = (await request.json())["prompt"].split()
        return web.json_response({"tokens": list(range(len(words))), "count": len(words)})

    async def _stream(self, request, pieces: list[str], usage: dict, chat: bool):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if chat:
                role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
                await resp.write(f"data: {json.dumps(role)}\n\n".encode())
            for piece in pieces:
                await asyncio.sleep(0.005)  # streams of a closed loop overlap
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"text": piece}
                await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        finally:
            self.inflight -= 1
        return resp

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = body["messages"]
        turn = sum(m["role"] == "user" for m in messages)
        if turn == self.fail_turn:
            self.fail_turn = None
            return web.json_response({"error": {"message": "boom"}}, status=500)
        self.bodies.append(body)
        seed = zlib.crc32(json.dumps(messages).encode())
        pieces = [f" x{(seed + i) % 1000}" for i in range(body["max_tokens"])]
        self.answers.append("".join(pieces))
        num_prompt = sum(len(m["content"].split()) for m in messages)
        num_cached = num_prompt - len(messages[-1]["content"].split())
        self.counters["generation_tokens_total"] += len(pieces)
        self.counters["prefix_cache_queries_total"] += num_prompt
        self.counters["prefix_cache_hits_total"] += num_cached
        usage = {
            "prompt_tokens": num_prompt,
            "completion_tokens": len(pieces),
            "total_tokens": num_prompt + len(pieces),
            "prompt_tokens_details": {"cached_tokens": num_cached},
        }
        return await self._stream(request, pieces, usage, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
        return await self._stream(request, [" y"] * body["max_tokens"], usage, chat=False)


async def run(fake: FakeOpenAI, spec: WorkloadSpec, stage: Stage) -> LoadSession:
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    cfg = ClientConfig(url=str(server.make_url("")).rstrip("/"))
    try:
        async with LoadSession(cfg, spec, show_progress=False) as session:
            await session.run(stage)
    finally:
        await server.close()
    return session


def by_conversation(bodies: list[dict], answers: list[str]) -> dict[str, list]:
    """(body, answer) pairs of each conversation (keyed by its first question), turn order."""
    out: dict[str, list] = {}
    for body, answer in zip(bodies, answers, strict=True):
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        out.setdefault(first, []).append((body, answer))
    return {k: sorted(v, key=lambda pair: len(pair[0]["messages"])) for k, v in out.items()}


async def test_each_turn_sends_the_history_with_every_real_answer():
    spec = WorkloadSpec(LengthDist.parse("5"), LengthDist.parse("4"), prefix_len=12, multi_turn=3)
    fake = FakeOpenAI()
    session = await run(fake, spec, Stage("closed", 2, num_requests=4))
    (stage,) = session.stages
    assert len(stage.results) == 12 and all(r.ok for r in stage.results)
    assert fake.max_inflight == 2  # two conversations in flight, one turn each at a time
    for body in fake.bodies:
        assert body["max_tokens"] == 4 and body["ignore_eos"] and body["stream"]
    systems = {json.dumps(b["messages"][0]) for b in fake.bodies}
    (system,) = systems
    assert (
        json.loads(system)["role"] == "system" and len(json.loads(system)["content"].split()) == 12
    )
    conversations = by_conversation(fake.bodies, fake.answers)
    assert len(conversations) == 4
    for turns in conversations.values():
        assert [len(b["messages"]) for b, _ in turns] == [2, 4, 6]
        for (body, answer), (after, _) in zip(turns, turns[1:]):
            history, (reply, question) = after["messages"][:-2], after["messages"][-2:]
            assert history == body["messages"]
            assert reply == {"role": "assistant", "content": answer}  # exactly what streamed
            assert question["role"] == "user" and question not in body["messages"]
    # The client's records: conversation numbers and turns, answers, the usage's token counts.
    numbers = {r.conversation for r in stage.results}
    assert numbers == {0, 1, 2, 3}
    for n in numbers:
        mine = sorted((r for r in stage.results if r.conversation == n), key=lambda r: r.turn)
        assert [r.turn for r in mine] == [1, 2, 3]
        assert [r.num_prompt_tokens for r in mine] == [17, 26, 35]  # + 4 answer + 5 question
        assert [r.num_cached_tokens for r in mine] == [12, 21, 30]  # all but the new question
        assert all(r.answer in fake.answers and r.num_output_tokens == 4 for r in mine)
    s = summarize(stage, SLO())
    assert [(t.turn, t.num_ok, t.prompt_tokens_mean) for t in s.turns] == [
        (1, 4, 17),
        (2, 4, 26),
        (3, 4, 35),
    ]
    assert [t.num_cached_tokens for t in s.turns] == [48, 84, 120]
    assert s.num_cached_tokens == 252 and s.cached_tokens_mean == 21
    assert s.cache_hit_share == 252 / (4 * (17 + 26 + 35))
    assert s.turn_ttft_ratio["last_turn"] == 3 and s.turn_ttft_ratio["p50"] > 0
    # The server's counters over the stage agree with the usage the clients summed.
    assert session.info.prefix_caching is True
    assert (stage.server_output_tokens, stage.server_cache_queries) == (48, 312)
    assert s.server_cached_tokens == 252 and s.server_cache_hit_share == s.cache_hit_share


async def test_an_agent_answers_each_reply_s_tool_call_with_its_result():
    spec = WorkloadSpec(
        LengthDist.parse("5"), LengthDist.parse("4"), prefix_len=12, multi_turn=3, agent=True
    )
    fake = FakeOpenAI()
    session = await run(fake, spec, Stage("closed", 2, num_requests=2))
    (stage,) = session.stages
    assert len(stage.results) == 6 and all(r.ok for r in stage.results)
    assert all(b["tools"] == AGENT_TOOLS for b in fake.bodies)
    conversations = by_conversation(fake.bodies, fake.answers)
    assert len(conversations) == 2
    for turns in conversations.values():
        assert [len(b["messages"]) for b, _ in turns] == [2, 4, 6]
        assert [m["role"] for m in turns[0][0]["messages"]] == ["system", "user"]
        for (body, answer), (after, _) in zip(turns, turns[1:]):
            history, (reply, result) = after["messages"][:-2], after["messages"][-2:]
            assert history == body["messages"]
            assert reply["role"] == "assistant" and reply["content"] == answer
            (call,) = reply["tool_calls"]
            assert call["function"]["name"] == "read_file"
            assert json.loads(call["function"]["arguments"])["path"].startswith("src/")
            assert result["role"] == "tool" and result["tool_call_id"] == call["id"]
            assert len(result["content"].split()) == 5  # --input-len words of a result
        calls = [m["tool_call_id"] for m in turns[-1][0]["messages"] if m["role"] == "tool"]
        assert len(set(calls)) == len(calls) == 2


async def test_a_failed_turn_ends_its_conversation():
    spec = WorkloadSpec(LengthDist.parse("3"), LengthDist.parse("2"), multi_turn=3)
    session = await run(FakeOpenAI(fail_turn=2), spec, Stage("closed", 1, num_requests=2))
    (stage,) = session.stages
    assert [(r.conversation, r.turn, r.ok) for r in stage.results] == [
        (0, 1, True),
        (0, 2, False),
        (1, 1, True),
        (1, 2, True),
        (1, 3, True),
    ]
    assert stage.results[1].error == "http 500"
    s = summarize(stage, SLO())
    assert [(t.turn, t.num_ok, t.num_requests) for t in s.turns] == [
        (1, 2, 2),
        (2, 1, 2),
        (3, 1, 1),
    ]


async def test_completions_share_the_prefix_ids_and_missing_cached_tokens_count_zero():
    spec = WorkloadSpec(LengthDist.parse("uniform:2-6"), LengthDist.parse("3"), prefix_len=20)
    fake = FakeOpenAI()
    (stage,) = (await run(fake, spec, Stage("closed", 3, num_requests=9))).stages
    prompts = [b["prompt"] for b in fake.bodies]
    assert len(prompts) == 9 and len({tuple(p[:20]) for p in prompts}) == 1
    assert len({tuple(p[20:]) for p in prompts}) == 9 and "messages" not in fake.bodies[0]
    assert all(r.ok and r.usage_reported and r.num_cached_tokens == 0 for r in stage.results)
    s = summarize(stage, SLO())
    assert s.cache_hit_share == 0.0 and s.cached_tokens_mean == 0.0 and s.turns == []
    assert s.num_prompt_tokens == sum(len(p) for p in prompts)
