"""A real `appliance serve` subprocess on the embedded model, driven by the official openai client:
chat and completions, streaming and not, n=2, stop strings, seeds, usage vs /tokenize, the
prefix cache (a repeated prompt's cached tokens, the counters, eviction when other prefixes fill
it), and a SIGTERM drain (in-flight completes, new gets 503, exit 0)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.support.serve_process import start_server

openai = pytest.importorskip("openai")

KEY = "sk-e2e-0123456789"
MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log_path) -> None:
        self.proc, self.url, self.log_path = proc, url, log_path
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict | str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                raw, status, ctype = resp.read(), resp.status, resp.headers["Content-Type"]
        except urllib.error.HTTPError as err:
            raw, status, ctype = err.read(), err.code, err.headers["Content-Type"]
        return status, json.loads(raw) if "json" in ctype else raw.decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("e2e") / "requests.jsonl"
    proc, url = start_server(
        "--max-model-len",
        "512",
        "--num-kv-blocks",
        "64",
        "--api-key",
        f"e2e:{KEY}",
        "--log-requests",
        str(log_path),
        "--drain-timeout",
        "60",
        "--log-level",
        "warning",
    )
    yield Server(proc, url, log_path)
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def test_chat_answers_and_usage_matches_tokenize(server):
    resp = server.client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=12, temperature=0
    )
    assert "Paris" in resp.choices[0].message.content
    status, tok = server.call("POST", "/tokenize", {"messages": FRANCE})
    assert status == 200 and resp.usage.prompt_tokens == tok["count"]
    assert resp.usage.completion_tokens <= 12
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    status, health = server.call("GET", "/health")
    assert status == 200 and health == {"status": "ok"}


def test_completion_stream_equals_plain(server):
    args = dict(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    plain = server.client.completions.create(**args)
    chunks = list(
        server.client.completions.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text and "Paris" in text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    status, tok = server.call("POST", "/tokenize", {"prompt": "The capital of France is"})
    assert plain.usage.prompt_tokens == tok["count"]


def test_n2_and_seed_reproducibility(server):
    args = dict(model=MODEL, prompt="My favourite colour is", max_tokens=6, temperature=1.0, n=2)
    first = server.client.completions.create(**args, seed=42)
    again = server.client.completions.create(**args, seed=42)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1]
    assert texts == [c.text for c in again.choices]
    assert texts[0] != texts[1]  # choice i uses seed + i
    assert first.usage.completion_tokens <= 12
    if all(c.finish_reason == "length" for c in first.choices):
        assert first.usage.completion_tokens == 12
    stream = server.client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=4, n=2, seed=1, stream=True
    )
    assert {c.choices[0].index for c in stream if c.choices} == {0, 1}


def test_stop_string(server):
    resp = server.client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=20, temperature=0, stop=["."]
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and "." not in choice.message.content
    assert "Paris" in choice.message.content


def test_errors_through_the_client(server):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 512 tokens"):
        server.client.completions.create(model=MODEL, prompt="Hi", max_tokens=600)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.client.completions.create(model="gpt-4", prompt="Hi", max_tokens=1)
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong-123456", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert [m.id for m in server.client.models.list().data] == [MODEL]


def test_stats_and_metrics_from_the_real_engine(server):
    status, stats = server.call("GET", "/v1/stats")
    assert status == 200 and stats["engine"]["kv_blocks_total"] == 64
    assert stats["config"]["max_model_len"] == 512 and stats["counters"]["finished_total"] >= 4
    status, metrics = server.call("GET", "/metrics")
    total = re.search(r'vllm:generation_tokens_total\{model_name="[^"]+"\} (\S+)', metrics)
    assert float(total.group(1)) > 0


def test_stats_report_the_decode_bandwidth(server):
    server.client.completions.create(model=MODEL, prompt="One, two,", max_tokens=8, temperature=0)
    _, stats = server.call("GET", "/v1/stats")
    bw = stats["engine"]["bandwidth"]  # as of the engine's last step: this request's decodes
    assert bw["decode_steps"] > 0 and bw["achieved_gbs"] > 0 and bw["bytes_per_step"] > 0
    assert bw["peak_gbs"] > 0 and bw["peak_source"].startswith("nominal")
    assert bw["share_perc"] == pytest.approx(100 * bw["achieved_gbs"] / bw["peak_gbs"])


def prefix_counters(server) -> tuple[float, float]:
    """(vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total) from /metrics."""
    _, text = server.call("GET", "/metrics")
    values = []
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        values.append(float(re.search(rf'^{name}\{{model_name="[^"]+"\}} (\S+)$', text, re.M)[1]))
    return values[0], values[1]


def token_prompt(seed: int, length: int) -> list[int]:
    """A prompt of token ids that shares no block with another seed's."""
    return [1000 + (seed * 7919 + i * 104729) % 40000 for i in range(length)]


def test_a_repeated_prompt_is_served_from_the_prefix_cache(server):
    _, stats = server.call("GET", "/v1/stats")
    block = stats["config"]["block_size"]
    assert stats["kv"]["prefix_cache"]["enabled"] is True
    prompt = token_prompt(1, 300)
    expected = (len(prompt) - 1) // block * block  # whole blocks; the last token is computed
    queries, hits = prefix_counters(server)
    args = dict(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    first = server.client.completions.create(**args)
    again = server.client.completions.create(**args)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == expected
    assert prefix_counters(server) == (queries + 2 * len(prompt), hits + expected)
    _, stats = server.call("GET", "/v1/stats")
    assert 0 < stats["kv"]["blocks_cached"] <= stats["engine"]["kv_blocks_total"]


def test_a_cache_salt_keeps_prefixes_apart(server):
    """Requests hit only blocks cached under their own salt; an empty salt is a 400."""
    block = server.call("GET", "/v1/stats")[1]["config"]["block_size"]
    prompt = token_prompt(2, 100)
    whole = (len(prompt) - 1) // block * block

    def cached(salt):
        extra = {} if salt is None else {"extra_body": {"cache_salt": salt}}
        resp = server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, **extra)
        return resp.usage.prompt_tokens_details.cached_tokens

    assert [cached("team-a"), cached("team-b"), cached(None)] == [0, 0, 0]
    assert [cached("team-a"), cached("team-b"), cached(None)] == [whole] * 3
    with pytest.raises(openai.BadRequestError) as err:
        cached("")
    assert err.value.body["param"] == "cache_salt"


def test_a_cache_full_of_other_prefixes_is_evicted_not_an_error(server):
    """Six 400-token prompts fill the 64 blocks (1,024 tokens of KV) more than twice over: the
    first prompt's blocks are taken for the others, and it is computed again."""
    _, stats = server.call("GET", "/v1/stats")
    block, total = stats["config"]["block_size"], stats["engine"]["kv_blocks_total"]
    prompts = [token_prompt(10 + k, 400) for k in range(6)]
    assert len(prompts) * 400 > 2 * block * total
    for prompt in prompts:
        resp = server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
        assert resp.usage.prompt_tokens_details.cached_tokens == 0
    again = server.client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens < (400 - 1) // block * block
    _, stats = server.call("GET", "/v1/stats")
    assert stats["kv"]["blocks_cached"] <= total


def test_a_chat_turn_hits_the_turn_before(server):
    """The next turn re-sends the conversation: its prompt and the answer's whole blocks hit."""
    turn = [{"role": "user", "content": "Tell me about the sea. " * 12}]
    first = server.client.chat.completions.create(
        model=MODEL, messages=turn, max_tokens=8, temperature=0
    )
    turn += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "More?"},
    ]
    second = server.client.chat.completions.create(
        model=MODEL, messages=turn, max_tokens=8, temperature=0
    )
    block = server.call("GET", "/v1/stats")[1]["config"]["block_size"]
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens // block * block - block


def test_sigterm_drains_then_exits_0(server):
    """Runs last: in-flight completes, new requests get 503, the process exits 0."""
    stream = server.client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=60,
        temperature=0,
        extra_body={"ignore_eos": True},
        stream=True,
    )
    chunks = [next(iter(stream))]
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while (health := server.call("GET", "/health"))[0] == 200:  # until the signal is handled
        assert time.monotonic() < deadline, "the server did not start draining in 30 s"
        time.sleep(0.01)
    assert health == (503, {"status": "draining"})
    with pytest.raises(openai.APIStatusError) as info:
        server.client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert info.value.status_code == 503
    chunks += list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert server.proc.wait(60) == 0
    lines = [json.loads(x) for x in server.log_path.read_text().splitlines()]
    assert lines and all(line["key_name"] == "e2e" for line in lines)
    assert KEY not in server.log_path.read_text()
