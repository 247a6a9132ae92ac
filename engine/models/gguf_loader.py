"""GGUF -> Hugging Face folder conversion, done once per file and cached on disk.

transformers' own GGUF support does the heavy lifting: it maps GGUF tensor names to Hugging Face
names, undoes llama.cpp's Q/K row permutation, dequantizes, and rebuilds the config, tokenizer
and chat template from the GGUF metadata. This module only runs it once, writes the result as an
ordinary model folder, and finds that folder again on later calls without touching transformers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

CACHE_ENV = "APPLIANCE_CACHE_DIR"
"""Environment variable naming the cache root (default ~/.cache/llm-appliance)."""

GGUF_MAGIC = b"GGUF"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
STALE_TMP_SECONDS = 6 * 3600  # a temp folder this old belongs to a conversion that died

# ggml tensor type ids that hold plain floats; anything else is a quantized block format
_GGML_F32, _GGML_F16, _GGML_BF16 = 0, 1, 30

UNFAITHFUL_GGUF = {
    "gemma4": (
        "transformers' GGUF conversion (5.24) reads none of Gemma 4's keys beyond the common "
        "ones: not final_logit_softcapping, shared_kv_layers, sliding_window_pattern, "
        "key_length_swa, the full layers' KV heads nor the experts', so the model it rebuilds "
        "is not the file's (where no tensor's shape disagrees, silently)"
    ),
}
"""GGUF architectures refused before conversion, each with the reason (tests/
test_gguf_unconverted.py checks that transformers still ignores those keys). gpt-oss needs no
entry: its conversion leaves the experts and sinks without values, which _convert refuses."""


def default_cache_root() -> Path:
    """`$APPLIANCE_CACHE_DIR`, else ~/.cache/llm-appliance."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-appliance"


def gguf_to_hf_folder(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Return a Hugging Face model folder equivalent to `gguf_path`, converting it on first use.

    The folder (config.json with `architectures`, model.safetensors in Hugging Face names,
    tokenizer.json, tokenizer_config.json with the chat template, special_tokens_map.json,
    generation_config.json) lives at `<cache root>/gguf/<key>`, the key derived from the file's
    absolute path, size and mtime: editing or replacing the file makes a fresh conversion.
    Quantized weights are saved dequantized in float32; float files keep their float type.
    The conversion is written to a temp folder and renamed into place, so a crash never leaves
    a half-written folder behind.

    Raises:
        FileNotFoundError: `gguf_path` does not exist.
        ValueError: it is not a GGUF file, or transformers cannot convert its architecture
            (it fails, or it leaves weights without a value from the file: gpt-oss and Gemma 4
            with transformers 5.24).
    """
    path = Path(gguf_path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found")
    _check_magic(path)
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    root = cache_root / "gguf"
    key = _cache_key(path)
    folder = root / key
    if _is_complete(folder):
        return folder

    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root, key)
    tmp = root / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    start = time.perf_counter()
    logger.info("converting %s to a Hugging Face folder (once; cached in %s)", path, folder)
    try:
        _convert(path, tmp)
        if folder.exists() and not _is_complete(folder):
            shutil.rmtree(folder, ignore_errors=True)  # left by something other than us
        try:
            os.rename(tmp, folder)
        except OSError:
            if not _is_complete(folder):  # not a concurrent conversion that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s in %.1f s", path.name, time.perf_counter() - start)
    return folder


def is_converted(gguf_path: str | Path, cache_dir: str | Path | None = None) -> bool:
    """Whether gguf_to_hf_folder(gguf_path) finds its folder in the cache (no conversion)."""
    path = Path(gguf_path).expanduser().resolve()
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    return _is_complete(cache_root / "gguf" / _cache_key(path))


def _check_magic(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); "
            "pass a .gguf file or a Hugging Face model folder"
        )


def _cache_key(path: Path) -> str:
    stat = path.stat()
    ident = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:80]
    return f"{stem}-{hashlib.sha256(ident).hexdigest()[:16]}"


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def _remove_stale_tmp(root: Path, key: str) -> None:
    now = time.time()
    for stale in root.glob(f".tmp-{key}-*"):
        try:
            if now - stale.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass


def _inspect(path: Path) -> tuple[str, torch.dtype]:
    """(architecture, dtype to save in): the file's float type, or float32 if it is quantized."""
    import torch

    try:
        architecture, types = _read_header(path)
    except Exception as e:  # a truncated or corrupt file fails in many ways inside the readers
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e
    if not types <= {_GGML_F32, _GGML_F16, _GGML_BF16}:
        return architecture, torch.float32
    if _GGML_BF16 in types:
        return architecture, torch.bfloat16
    return architecture, torch.float16 if _GGML_F16 in types else torch.float32


def _read_header(path: Path) -> tuple[str, set[int]]:
    """(architecture, ggml tensor type ids) without reading tensor data."""
    try:  # transformers >= 5.x skips over metadata values: ~0.1 s instead of ~5 s here
        from transformers.integrations.gguf.reader import GgufHeader
    except ImportError:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
        return architecture, {int(t.tensor_type) for t in reader.tensors}
    header = GgufHeader.from_file(str(path))
    return header.architecture, {int(info.ggml_type) for info in header.tensors}


def _convert(path: Path, out: Path) -> None:
    """Load `path` with transformers' GGUF support and save it as a plain folder in `out`."""
    import transformers
    from huggingface_hub.errors import StrictDataclassError
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    architecture, dtype = _inspect(path)
    source, name = str(path.parent), path.name
    cannot = (
        f"cannot convert {path} (GGUF architecture {architecture!r}) with the installed "
        f"transformers {transformers.__version__}"
    )
    if architecture in UNFAITHFUL_GGUF:
        raise ValueError(
            f"{cannot}: {UNFAITHFUL_GGUF[architecture]}; load the model's Hugging Face "
            "checkpoint instead"
        )
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            source, gguf_file=name, dtype=dtype, local_files_only=True, output_loading_info=True
        )
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name, local_files_only=True)
    except (ValueError, KeyError, NotImplementedError, RuntimeError, StrictDataclassError) as e:
        # RuntimeError: a tensor whose shape differs from the config transformers rebuilt;
        # StrictDataclassError: a config value of another type than the config class takes
        raise ValueError(f"{cannot}: {type(e).__name__}: {e}") from e
    if missing := sorted(info.get("missing_keys") or ()):
        raise ValueError(
            f"{cannot}: its conversion leaves {len(missing)} weights without a value from the "
            f"file (it would fill them with random values): {', '.join(missing[:6])}"
            + (" ..." if len(missing) > 6 else "")
            + "; load the model's Hugging Face checkpoint instead"
        )

    # Tied weights share storage; keep the first name (the embedding) as save_pretrained does.
    weights, seen = {}, set()
    state = model.state_dict()
    names = set(state)
    for key, tensor in state.items():
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if ident in seen:
            continue
        seen.add(ident)
        weights[key] = tensor.detach().to(dtype).contiguous()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})

    config = model.config
    if architecture == "gemma3":
        from engine.models.gguf_metadata import read_gguf_metadata

        restore_gemma3_config(config, read_gguf_metadata(path, "gemma3."))
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # weights are saved dequantized: a plain checkpoint
    config.architectures = [type(model).__name__]
    # lm_head dropped above as a duplicate of the embedding <=> tied
    config.tie_word_embeddings = "lm_head.weight" in names and "lm_head.weight" not in weights
    config.dtype = dtype
    config.save_pretrained(out)

    generation = model.generation_config
    if generation.eos_token_id is None:
        eos = config.eos_token_id
        generation.eos_token_id = eos if eos is not None else tokenizer.eos_token_id
    generation.save_pretrained(out)

    tokenizer.save_pretrained(out, save_jinja_files=False)  # chat_template in tokenizer_config
    if not (out / "special_tokens_map.json").is_file():
        special = {k: str(v) for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    manifest = {"source": str(path), "size": path.stat().st_size, "dtype": str(dtype)}
    (out / "gguf_source.json").write_text(json.dumps(manifest, indent=2) + "\n")


GEMMA3_27B_LAYERS = 62
"""llama.cpp tells Gemma 3 27B by its layer count: the one size whose attention scale is
(hidden_size / num_heads)**-0.5 (query_pre_attn_scalar 168) instead of head_dim**-0.5."""


def restore_gemma3_config(config, metadata: dict[str, object]) -> None:
    """Put back what transformers' GGUF conversion leaves out of a Gemma 3 config: the global
    layers' linear RoPE scaling, which llama.cpp's converter writes as gemma3.rope.scaling.*
    (4B and up: factor 8), and the 27B's query_pre_attn_scalar, which no GGUF key carries
    (llama.cpp derives it from the size, as GEMMA3_27B_LAYERS says)."""
    if metadata.get("gemma3.rope.scaling.type") == "linear":
        factor = float(metadata["gemma3.rope.scaling.factor"])
        config.rope_parameters["full_attention"].update(rope_type="linear", factor=factor)
    if config.num_hidden_layers == GEMMA3_27B_LAYERS:
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads
