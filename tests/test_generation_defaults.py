"""Model defaults: a request's omitted temperature, top_p, top_k, repetition_penalty and
max_tokens come from --override-generation-config, else the model's generation_config.json (or
a GGUF file's general.sampling.* metadata), else the server's; the values a request ran with
are in its trace and its request-log line."""

from __future__ import annotations

import json

import gguf
import pytest
from transformers import GenerationConfig

from appliance.cli import main
from appliance.generation_defaults import load_generation_defaults, server_defaults
from appliance.settings import ServeSettings, SettingsError
from engine.models.gguf_metadata import read_gguf_metadata
from tests.support.fake_server import fake_client

COMPLETIONS = "/v1/completions"
MODEL = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}


@pytest.fixture
def model_folder(tmp_path):
    """A model folder whose generation_config.json (written by transformers) sets every field."""
    folder = tmp_path / "model"
    GenerationConfig(do_sample=True, max_new_tokens=5, **MODEL).save_pretrained(folder)
    return folder


async def run(client, body: dict) -> tuple[dict, dict]:
    """(the response, the request's trace)."""
    r = await client.post(COMPLETIONS, json={"prompt": "w1", **body})
    assert r.status == 200, await r.text()
    trace = await (await client.get(f"/v1/requests/{r.headers['X-Request-Id']}")).json()
    return await r.json(), trace


async def test_the_model_defaults_fill_only_the_omitted_fields(model_folder, tmp_path):
    log = tmp_path / "requests.jsonl"
    async with fake_client(model=str(model_folder), log_requests=str(log)) as client:
        answer, trace = await run(client, {})
        assert answer["usage"]["completion_tokens"] == 5  # max_new_tokens
        sampling = trace["sampling"]
        assert {k: sampling[k] for k in MODEL} == MODEL and sampling["max_tokens"] == 5
        assert set(sampling["sources"].values()) == {"model"}

        answer, trace = await run(client, {"temperature": 0.2, "max_tokens": 3, "top_k": -1})
        assert answer["usage"]["completion_tokens"] == 3
        sampling = trace["sampling"]
        assert (sampling["temperature"], sampling["top_k"], sampling["max_tokens"]) == (0.2, -1, 3)
        assert (sampling["top_p"], sampling["repetition_penalty"]) == (0.9, 1.1)
        assert sampling["sources"] == {
            "temperature": "request",
            "top_p": "model",
            "top_k": "request",
            "repetition_penalty": "model",
            "max_tokens": "request",
        }
        stats = await (await client.get("/v1/stats")).json()
        shown = stats["server"]["generation_defaults"]
        assert shown["temperature"] == {"value": 0.6, "source": "model"}
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["sampling"]["temperature"] for line in lines] == [0.6, 0.2]
    assert lines[1]["sampling"]["sources"]["temperature"] == "request"


async def test_none_ignores_the_model_file(model_folder):
    async with fake_client(model=str(model_folder), generation_config="none") as client:
        answer, trace = await run(client, {})
        assert answer["usage"]["completion_tokens"] == 16  # completions' own default
        ours = server_defaults()
        assert {k: trace["sampling"][k] for k in MODEL} == {k: ours[k] for k in MODEL}
        assert set(trace["sampling"]["sources"].values()) == {"server"}


async def test_overrides_win_over_the_model_and_requests_win_over_both(model_folder):
    override = '{"temperature": 0.3, "max_new_tokens": 4}'
    async with fake_client(model=str(model_folder), override_generation_config=override) as client:
        answer, trace = await run(client, {})
        assert answer["usage"]["completion_tokens"] == 4
        s = trace["sampling"]
        assert (s["temperature"], s["top_p"]) == (0.3, 0.9)
        assert (s["sources"]["temperature"], s["sources"]["top_p"]) == ("override", "model")
        _, trace = await run(client, {"temperature": 1.5})
        assert trace["sampling"]["temperature"] == 1.5


async def test_a_model_max_tokens_default_stops_at_the_end_of_the_context(tmp_path):
    GenerationConfig(max_new_tokens=100_000).save_pretrained(tmp_path)
    async with fake_client(model=str(tmp_path)) as client:
        r = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "w1"}]}
        )
        assert r.status == 200, await r.text()
        limit = (await (await client.get("/v1/models")).json())["data"][0]["max_model_len"]
        trace = await (await client.get(f"/v1/requests/{r.headers['X-Request-Id']}")).json()
        prompt = trace["prompt_tokens"]
        assert trace["sampling"]["max_tokens"] == limit - prompt


def test_do_sample_false_means_greedy(tmp_path):
    # As some published files are (transformers itself refuses to save this combination).
    config = {"do_sample": False, "temperature": 0.7, "top_p": 0.8, "bos_token_id": 1}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    defaults = load_generation_defaults("auto", str(tmp_path), {})
    assert defaults.values["temperature"] == 0.0 and defaults.values["top_p"] == 0.8
    assert defaults.origin == str((tmp_path / "generation_config.json").resolve())


def test_a_path_names_the_file_or_its_folder(model_folder, tmp_path):
    for path in (model_folder, model_folder / "generation_config.json"):
        defaults = load_generation_defaults(str(path), None, {})
        assert defaults.values == {**MODEL, "max_tokens": 5}
    with pytest.raises(SettingsError, match="has no generation_config.json"):
        load_generation_defaults(str(tmp_path), None, {})
    with pytest.raises(SettingsError, match="no such file or folder"):
        ServeSettings(generation_config=str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{temperature: 0.6}", "not valid JSON"),
        ("[0.6]", "must be a JSON object"),
        ('{"temp": 0.6}', "unknown field(s) temp; allowed: temperature, top_p"),
        ('{"top_p": 3}', "top_p must be in (0, 1]"),
        ('{"top_k": 2.5}', "top_k must be an integer"),
        ('{"temperature": "hot"}', "temperature must be a number"),
    ],
)
def test_bad_overrides_are_settings_errors(text, message):
    with pytest.raises(SettingsError) as err:
        ServeSettings(override_generation_config=text)
    assert message in str(err.value)


def test_serve_refuses_a_bad_override_before_starting(capsys):
    assert main(["serve", "--override-generation-config", '{"top_p": 0}']) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err


def test_gguf_sampling_metadata(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string(gguf.Keys.General.NAME, "tiny")
    writer.add_array(gguf.Keys.Tokenizer.LIST, ["a", "bb", "ccc"])
    writer.add_array("tiny.scores", [0.5, 1.5])
    writer.add_float32(gguf.Keys.General.SAMPLING_TEMP, 0.6)
    writer.add_uint32(gguf.Keys.General.SAMPLING_TOP_K, 40)
    writer.add_float32(gguf.Keys.General.SAMPLING_PENALTY_REPEAT, 1.05)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reference = gguf.GGUFReader(str(path))  # the library's reader: every scalar it sees
    expected = {
        name: f.contents()
        for name, f in reference.fields.items()
        if f.types[0] != gguf.GGUFValueType.ARRAY and not name.startswith("GGUF.")
    }
    assert gguf.Keys.General.SAMPLING_TEMP in expected and len(expected) == 5
    assert read_gguf_metadata(path) == pytest.approx(expected)
    defaults = load_generation_defaults("auto", str(path), {})
    assert defaults.values == {"temperature": 0.6, "top_k": 40, "repetition_penalty": 1.05}


def test_the_embedded_model_carries_no_sampling_defaults():
    """SmolLM2-135M-Instruct ships as a GGUF file without general.sampling.* keys, so its
    requests get the server's defaults."""
    defaults = load_generation_defaults("auto", None, {})
    assert defaults.values == {}
    assert "no general.sampling.* metadata" in defaults.origin or defaults.origin.startswith("none")
