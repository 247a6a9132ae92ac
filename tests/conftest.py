"""Shared fixtures: tiny random-weight models of each supported architecture, saved with
transformers' save_pretrained together with a small byte-level tokenizer; the Triton a kernel
compile check runs under (`each_triton`: the venv's, and the H200's, installed on first use).

GPU tests carry one mark, `@pytest.mark.gpu` (or `pytestmark = pytest.mark.gpu`): without a
CUDA GPU they are skipped here, and `pytest -m gpu` selects every one of them on a GPU machine.
Helpers the tests share live in tests/support/; so do the expensive things several modules use
alike, built once a session here: the embedded model's conversion (`embedded_folder`) and one
real server on it (`shared_server`)."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import LlamaConfig

from tests.support.serve_process import start_server
from tests.support.shared_server import FLAGS, KEYS, SharedServer
from tests.support.tiny_models import ARCHS, make_tiny_model
from tests.support.triton_versions import install_h200_triton


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _free_gpu_memory(request):
    """After a GPU test, free what its engines held, so the next one plans on an empty card
    (an engine plans its KV pool from the memory free when it starts)."""
    yield
    if "gpu" in request.keywords and torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model(request, tmp_path_factory):
    """(arch, folder) for each supported architecture."""
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    make_tiny_model(request.param, folder)
    return request.param, folder


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama-single")
    make_tiny_model("llama", folder)
    return folder


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory):
    """A tiny Llama whose projections are whole 128 x 128 blocks (Q/K/V 128 rows each)."""
    config = LlamaConfig(
        vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        eos_token_id=256, bos_token_id=257, pad_token_id=258, tie_word_embeddings=False,
    )  # fmt: skip
    return make_tiny_model(config, tmp_path_factory.mktemp("wide-llama"))


@pytest.fixture(scope="session")
def h200_triton():
    """The H200's Triton, installed once per clone on first use (tests/support/triton_versions.py);
    a session without a reachable registry skips the tests that ask for it."""
    return install_h200_triton()


@pytest.fixture
def triton_dir(request):
    """Set by `each_triton`: None for the venv's Triton, else the H200's folder."""
    return None if request.param == "venv" else request.getfixturevalue("h200_triton")


@pytest.fixture(scope="session")
def embedded_folder():
    """The embedded GGUF converted to a Hugging Face folder in the default cache root, once a
    session (the servers the tests start convert it there too); tests that point
    APPLIANCE_CACHE_DIR elsewhere but need no conversion of their own link it in."""
    from engine.models.embedded import default_model_path
    from engine.models.gguf_loader import gguf_to_hf_folder

    return gguf_to_hf_folder(default_model_path())


@pytest.fixture(scope="session")
def shared_server():
    """`appliance serve` on the embedded model with tests/support/shared_server.py's flags, for
    the modules whose tests need no flag of their own; stopped at the end of the session."""
    proc, url = start_server(*FLAGS)
    yield SharedServer(url, dict(KEYS))
    proc.kill()
    proc.wait(30)
