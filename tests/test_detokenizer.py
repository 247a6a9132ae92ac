"""IncrementalDetokenizer: streamed text equals a full decode, never shows half characters,
and cuts exactly at stop strings; checked on real tokenizers (SmolLM2's GGUF byte-level BPE, a
trained byte-level BPE, SentencePiece-style byte-fallback BPEs)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from engine.models.embedded import default_model_path
from engine.text.detokenizer import IncrementalDetokenizer, raw_decoder

SAMPLES = [
    "Hello, world! This is a plain ASCII sentence, with numbers 12345.",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストです。カタカナもあります。한국어 문장도 있습니다.",
    "Emoji: 🎉🚀👍🏽 and a family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵!",
    "Mixed: naïve café — “quotes” … 你好 🎉 end",
    "  leading spaces\n\nnew lines\ttabs   trailing  ",
    "Math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝒳 and rare CJK 𠀀𠀁𪚥 ok",
]
CORPUS = [
    "the quick brown fox jumps over the lazy dog and the cat sat on the mat",
    "hello world, this is a test of the tokenizer training with some text",
    "你好世界，今天天气很好，我们去公园散步吧。中文文本用于训练。",
    "日本語のテキストです。カタカナもあります。한국어 문장도 있습니다.",
    "emoji 🎉🚀👍🏽 👨‍👩‍👧‍👦 🇫🇷 naïve café “quotes” …",
] * 20
ASCII_CORPUS = [line for line in CORPUS if line.isascii()]


def _byte_level_bpe() -> PreTrainedTokenizerFast:
    """GPT-2 style: every byte is a symbol, so merges can split a character across tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def _byte_fallback_bpe(decoder: str) -> PreTrainedTokenizerFast:
    """SentencePiece style (Llama-2 / Mistral): '▁' for spaces, <0xNN> pieces for unknown
    characters. Trained on ASCII only, so every CJK character and emoji falls back to bytes."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(ASCII_CORPUS, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    if decoder == "strip":  # Llama-2's tokenizer.json
        tok.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
    else:
        tok.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(scope="module", params=["smollm2", "byte_level", "fallback_strip", "fallback_ms"])
def tokenizer(request):
    if request.param == "smollm2":
        path = default_model_path()
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if request.param == "byte_level":
        return _byte_level_bpe()
    return _byte_fallback_bpe("strip" if request.param == "fallback_strip" else "metaspace")


def _stream(tok, ids, chunks=None, skip_special_tokens=True, stop=()):
    """Feed `ids` in chunks of the given sizes (1 each by default); return the deltas."""
    detok = IncrementalDetokenizer(tok, [1, 2, 3], skip_special_tokens, list(stop))
    sizes = iter(chunks or [])
    deltas, i = [], 0
    while i < len(ids):
        n = next(sizes, 1)
        deltas.append(detok.step(ids[i : i + n]))
        i += n
    deltas.append(detok.finish())
    assert "".join(deltas) == detok.text
    return deltas, detok


def _random_chunks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 7) for _ in range(n)]


def test_byte_fallback_tokenizers_really_split_characters():
    tok = _byte_fallback_bpe("strip")
    pieces = tok.convert_ids_to_tokens(tok.encode("你🎉", add_special_tokens=False))
    assert pieces[-4:] == ["<0xF0>", "<0x9F>", "<0x8E>", "<0x89>"]


@pytest.mark.parametrize("text", SAMPLES)
def test_one_token_at_a_time_equals_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, _ = _stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("seed", range(3))
def test_random_chunks_equal_full_decode(tokenizer, seed):
    text = " ".join(SAMPLES)
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, _ = _stream(tokenizer, ids, _random_chunks(len(ids), seed))
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_inside_output(tokenizer, skip):
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode(SAMPLES[4], add_special_tokens=False)
    ids = ids[:3] + [eos] + ids[3:7] + [eos, eos] + ids[7:] + [eos]
    deltas, _ = _stream(tokenizer, ids, skip_special_tokens=skip)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab é你好🎉👍🏽\n𠀀")), max_size=30),
    seed=st.integers(0, 1000),
)
def test_streaming_property(tokenizer, text, seed):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, _ = _stream(tokenizer, ids, _random_chunks(len(ids), seed))
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)


def test_stop_string_spanning_tokens_cuts_before_it(tokenizer):
    text = "The answer is here. Final answer: 42 and then more text after it."
    stop = "Final answer"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(tokenizer.encode(stop, add_special_tokens=False)) > 1  # spans tokens
    deltas, detok = _stream(tokenizer, ids, stop=[stop])
    assert detok.text == "The answer is here. "
    assert detok.stopped_on == stop
    assert detok.step(ids[:3]) == "" and detok.finish() == ""  # nothing after a stop


@pytest.mark.parametrize("seed", range(3))
def test_earliest_stop_wins_in_random_chunks(tokenizer, seed):
    text = "你好，世界！🎉 one two three four"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stops = ["three", "世界", "🎉 one"]
    _, detok = _stream(tokenizer, ids, _random_chunks(len(ids), seed), stop=stops)
    assert detok.text == "你好，"
    assert detok.stopped_on == "世界"


def test_holds_back_only_a_possible_stop_start(tokenizer):
    stop = ["STOP!", "\n\n"]
    text = "We START here.\nThen a STOry. Not a stop at all, ST"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], True, stop)
    for i in range(len(ids)):
        detok.step(ids[i : i + 1])
        full = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        assert full.startswith(detok.text)
        assert len(full) - len(detok.text) <= max(map(len, stop)) - 1
    assert detok.text == text[:-2]  # "ST" could still become "STOP!"
    assert detok.finish() == "ST"
    assert detok.stopped_on is None and detok.text == text


def test_decodes_only_a_window_of_recent_tokens(tokenizer):
    class CountingTokenizer:
        max_ids = 0

        def decode(self, ids, **kwargs):
            CountingTokenizer.max_ids = max(CountingTokenizer.max_ids, len(ids))
            return tokenizer.decode(ids, **kwargs)

    ids = tokenizer.encode(" ".join(SAMPLES * 3), add_special_tokens=False)
    assert len(ids) > 200
    deltas, _ = _stream(CountingTokenizer(), ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert CountingTokenizer.max_ids <= 12


@pytest.mark.parametrize("skip", [True, False])
def test_the_raw_decoder_equals_decode(tokenizer, skip):
    ids = tokenizer.encode(" ".join(SAMPLES), add_special_tokens=False)
    ids = ids[:40] + [tokenizer.eos_token_id] + ids[40:]
    decode = raw_decoder(tokenizer)
    for start in range(0, len(ids), 7):
        window = ids[start : start + 9]
        assert decode(window, skip) == tokenizer.decode(window, skip_special_tokens=skip)


def test_a_tokenizer_that_cleans_up_spaces_keeps_its_clean_up():
    """WordPiece with clean_up_tokenization_spaces: decode turns " ," into ","; the raw
    decoder must too (it falls back to tokenizer.decode)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"])
    tok.train_from_iterator(ASCII_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", clean_up_tokenization_spaces=True
    )
    ids = fast.encode("hello world, this is a test.", add_special_tokens=False)
    assert fast.backend_tokenizer.decode(ids) != fast.decode(ids)  # the clean-up matters here
    assert raw_decoder(fast)(ids, True) == fast.decode(ids, skip_special_tokens=True)
