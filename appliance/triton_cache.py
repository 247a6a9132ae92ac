"""Where Triton keeps the kernels it compiles for the appliance: `<cache root>/triton` (the
cache root of engine.models.gguf_loader: $APPLIANCE_CACHE_DIR, else ~/.cache/llm-appliance),
unless the user set TRITON_CACHE_DIR. A second start finds every kernel there and compiles
nothing.

Triton reads TRITON_CACHE_DIR each time it opens its cache (triton.knobs.cache.dir, a
descriptor over the environment, in Triton 3.6 and 3.9), so setting the variable at any time
before the first compile works, in this process and in every process it starts afterwards.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def triton_cache_env(environ: MutableMapping[str, str] | None = None) -> Path:
    """Point TRITON_CACHE_DIR in `environ` (default: os.environ) at the appliance's cache
    unless it is set already, create the folder, and return it. Raises ValueError, naming the
    variables to set, when the folder cannot be created."""
    from engine.models.gguf_loader import CACHE_ENV, default_cache_root

    environ = os.environ if environ is None else environ
    own = TRITON_CACHE_ENV not in environ
    folder = default_cache_root() / "triton" if own else Path(environ[TRITON_CACHE_ENV])
    try:
        folder.expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        names = f"{CACHE_ENV} or {TRITON_CACHE_ENV}" if own else TRITON_CACHE_ENV
        raise ValueError(
            f"cannot create Triton's kernel cache {folder} ({exc.strerror}): "
            f"set {names} to a writable folder"
        ) from exc
    if own:
        environ[TRITON_CACHE_ENV] = str(folder)
    return folder
