"""Shared fixtures: tiny random-weight models of each supported architecture, saved with
transformers' save_pretrained together with a small byte-level tokenizer.

GPU tests carry one mark, `@pytest.mark.gpu` (or `pytestmark = pytest.mark.gpu`): without a
CUDA GPU they are skipped here, and `pytest -m gpu` selects every one of them on a GPU machine.
Helpers the tests share live in tests/support/."""

from __future__ import annotations

import pytest
import torch

from tests.support.tiny_models import ARCHS, make_tiny_model


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
