"""Bad input raises a clear ValueError naming the limit, and the engine keeps working."""

from __future__ import annotations

import json
import shutil

import pytest

from engine import LLM, SamplingParams
from engine.structured import StructuredOutput
from engine.text.surrogates import find_in_value

OK = SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), device="cpu", max_model_len=64)


def test_empty_prompt(llm):
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[]], OK)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([""], OK)


def test_prompt_longer_than_max_model_len(llm):
    with pytest.raises(ValueError, match=r"maximum context length is 64 tokens.*70 in the prompt"):
        llm.generate([list(range(70))], OK)
    with pytest.raises(ValueError, match=r"asks for 65 \(60 in the prompt, 5 to generate\)"):
        llm.generate([list(range(60))], SamplingParams(max_tokens=5))


def test_token_ids_out_of_vocab(llm):
    with pytest.raises(ValueError, match=r"in \[0, 320\)"):
        llm.generate([[1, 2, 99999]], OK)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens must be a positive integer"),
        (dict(max_tokens=-3), "max_tokens must be a positive integer"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(top_k=-5), "top_k must be -1"),
        (dict(min_p=2.0), r"min_p must be in \[0, 1\]"),
        (dict(logprobs=99), r"logprobs must be in \[0, 20\]"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_a_failed_batch_queues_nothing_and_the_engine_keeps_working(llm):
    with pytest.raises(ValueError):
        llm.generate([[1, 2, 3], list(range(100))], OK)
    assert not llm.engine.has_unfinished()
    out = llm.generate([[1, 2, 3]], OK)[0]
    assert len(out.token_ids) == 4


def test_unknown_architecture(tiny_llama, tmp_path):
    folder = tmp_path / "gpt2ish"
    shutil.copytree(tiny_llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported model architecture.*LlamaForCausalLM"):
        LLM(str(folder), device="cpu")


def test_missing_model_and_missing_weights(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="not found"):
        LLM(str(tmp_path / "nope"), device="cpu")
    folder = tmp_path / "noweights"
    shutil.copytree(tiny_llama, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        LLM(str(folder), device="cpu")


def test_unknown_setting_and_bad_limits(tiny_llama):
    with pytest.raises(ValueError, match="unknown engine setting"):
        LLM(str(tiny_llama), device="cpu", max_num_seq=4)
    with pytest.raises(ValueError, match="max_model_len=5000 exceeds"):
        LLM(str(tiny_llama), device="cpu", max_model_len=5000)
    with pytest.raises(ValueError, match=r"pool holds 2 \(32 tokens.*set max_model_len to 32"):
        LLM(str(tiny_llama), device="cpu", num_kv_blocks=2, max_model_len=64)


def test_random_weights_need_only_a_config(tiny_llama, tmp_path):
    (tmp_path / "config.json").write_text((tiny_llama / "config.json").read_text())
    llm = LLM(str(tmp_path), device="cpu", load_format="random")
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and out.text == ""
    with pytest.raises(ValueError, match="no tokenizer: pass prompts as token ids"):
        llm.generate(["text"], OK)


def test_bad_quantization_settings_are_refused_naming_the_setting(tiny_llama):
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM(str(tiny_llama), device="cpu", quantization="int3")
    with pytest.raises(ValueError, match="quant_block_size"):
        LLM(str(tiny_llama), device="cpu", quantization="int4", quant_block_size=7)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("a\ud800b", r"the prompt is not valid Unicode: .*\(U\+D800\) at character 1"),
        ("\udfff", r"the prompt is not valid Unicode: .*\(U\+DFFF\) at character 0"),
    ],
)
def test_a_prompt_with_a_lone_surrogate_is_a_value_error(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], OK)
    assert len(llm.generate(["ok \U0001f600"], OK)[0].token_ids) == 4


def test_chat_messages_with_a_lone_surrogate_name_the_message(llm):
    bad = [{"role": "user", "content": "hi"}, {"role": "user", "content": "x\ud83d"}]
    with pytest.raises(ValueError, match=r"messages\[1\]\.content is not valid Unicode"):
        llm.chat([bad], OK)
    tools = [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]
    with pytest.raises(ValueError, match=r"tools\[0\]\.function\.description is not valid"):
        llm.engine.apply_chat_template(bad[:1], tools)
    with pytest.raises(ValueError, match=r"a key of chat_template_kwargs is not valid"):
        llm.engine.apply_chat_template(bad[:1], None, {"\ud800": True})


@pytest.mark.parametrize(
    "spec, place",
    [
        (StructuredOutput("regex", "[a-z]\ud800"), r"regex is not valid Unicode"),
        (StructuredOutput("grammar", 'start: "\ud800"'), r"grammar is not valid Unicode"),
        (StructuredOutput.choice(["ok", "\udc00"]), r"choice\[1\] is not valid Unicode"),
        (
            StructuredOutput.json_schema({"properties": {"a": {"pattern": "\ud800"}}}),
            r"schema\.properties\.a\.pattern is not valid Unicode",
        ),
        (
            StructuredOutput.json_schema({"properties": {"\ud800": {}}}),
            r"a key of schema\.properties is not valid Unicode",
        ),
    ],
    ids=["regex", "grammar", "choice", "schema", "schema-key"],
)
def test_a_grammar_with_a_lone_surrogate_is_a_value_error_naming_it(llm, spec, place):
    params = SamplingParams(max_tokens=4, temperature=0.0, structured=spec)
    with pytest.raises(ValueError, match=place):
        llm.generate([[1, 2, 3]], params)
    assert not llm.engine.has_unfinished()


def test_surrogates_are_found_in_document_order_and_pairs_are_text():
    value = json.loads('{"a": ["ok", {"b\\udc00": "x"}], "c": "\\ud800"}')
    found = find_in_value(value)
    assert (found.path, found.in_key, found.index) == (("a", 1), True, 1)
    assert find_in_value(json.loads('{"emoji": "\\ud83d\\ude00", "k\\u00e9": [1, null]}')) is None
    deep = json.loads("[" * 900 + '"\\ud800"' + "]" * 900)  # as deep as json.loads goes
    assert find_in_value(deep).path == (0,) * 900
