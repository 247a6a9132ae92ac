"""ServeSettings: the typed server configuration, and the one place that builds it from
CLI flags, a TOML file and APPLIANCE_* environment variables (flags > env > file > defaults)."""

from __future__ import annotations

import ipaddress
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

ENV_PREFIX = "APPLIANCE_"
ENGINE_FIELDS = (
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks",
    "gpu_memory_utilization", "dtype", "kv_cache_dtype", "quantization", "enforce_eager", "seed",
    "adaptive_batching", "load_format", "quant_block_size", "quantize_embeddings",
)  # fmt: skip
PROFILE_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "adaptive_batching")
"""Settings a tuned profile (`appliance tune`) supplies, below everything the user sets."""


class SettingsError(ValueError):
    """A setting is invalid; the message says which and how to fix it."""


@dataclass(frozen=True)
class ApiKey:
    """One accepted API key; `name` appears in logs, the key never does."""

    name: str
    key: str = field(repr=False)


@dataclass
class ServeSettings:
    """Everything `appliance serve` needs. Field names are the CLI flags with dashes."""

    model: str | None = None
    """Hugging Face model folder or .gguf file; None = the embedded SmolLM2-135M-Instruct."""
    served_model_name: str | None = None
    """Name clients use for the model; None = the engine's model name."""
    host: str = "127.0.0.1"
    """Address to bind. Non-loopback addresses need an API key (or --insecure-no-auth)."""
    port: int = 8000
    """TCP port to bind (0 = any free port)."""
    device: str = "auto"
    """auto, cuda or cpu."""
    dtype: str = "auto"
    """Weights/activations dtype: auto, float32, float16 or bfloat16."""
    max_model_len: int | None = None
    """Longest prompt + output in tokens; None = the model's maximum (planned)."""
    max_num_seqs: int | None = None
    """Most sequences running at once; None = the engine default."""
    max_num_batched_tokens: int | None = None
    """Token budget of one engine step; None = the engine default."""
    block_size: int | None = None
    """Tokens per KV-cache block; None = the engine default."""
    num_kv_blocks: int | None = None
    """KV-cache blocks; None = planned from memory."""
    gpu_memory_utilization: float | None = None
    """Share of device memory the engine may use; None = the engine default."""
    kv_cache_dtype: str | None = None
    """KV-cache element type; None = the engine default."""
    quantization: str | None = None
    """Weight quantization (none, int8, int4, auto); None = the engine default."""
    quant_block_size: int | None = None
    """int4: weights per absmax group along a row; None = the engine default (64)."""
    quantize_embeddings: bool | None = None
    """With int8/int4: quantize the LM head and embeddings too; None = no."""
    enforce_eager: bool | None = None
    """Disable CUDA graphs; None = the engine default."""
    seed: int | None = None
    """Engine seed for requests without their own; None = the engine default."""
    adaptive_batching: bool | None = None
    """Scale each step's token budget with the waiting queue; None = the engine default (off)."""
    load_format: str | None = None
    """auto (the model's weights; None = the engine default, auto) or random (random weights in
    the model's shapes: a preset name from profiles/models as --model then serves that shape
    with the embedded tokenizer)."""
    profile: str | None = None
    """A tuned profile (name under profiles/tuned/ or a .toml path) written by `appliance tune`:
    its chosen values apply where no flag, variable or config file sets them."""
    max_queue: int = 128
    """Most requests waiting for a slot; past it requests get 429 with Retry-After."""
    api_key: list[str] = field(default_factory=list, repr=False)
    """API keys accepted as `Authorization: Bearer KEY`, each `KEY` or `NAME:KEY`."""
    api_key_file: str | None = None
    """File of API keys, one per line: `KEY` or `NAME KEY`; # starts a comment."""
    insecure_no_auth: bool = False
    """Allow a non-loopback bind without any API key."""
    drain_timeout: float = 30.0
    """Seconds in-flight requests may run after SIGTERM/SIGINT before they are cut."""
    request_timeout: float = 600.0
    """Longest total time of a request in seconds (0 = none)."""
    ttft_timeout: float = 300.0
    """Longest wait for the first token in seconds, queueing included (0 = none)."""
    stall_timeout: float = 60.0
    """Longest gap between two tokens in seconds (0 = none)."""
    log_requests: str | None = None
    """Append one JSON line per finished request to this file (written off the engine thread)."""
    ssl_certfile: str | None = None
    """TLS certificate (PEM); serve HTTPS when given with --ssl-keyfile."""
    ssl_keyfile: str | None = None
    """TLS private key (PEM)."""
    cors_origin: list[str] = field(default_factory=list)
    """Origins allowed by CORS; none = no CORS headers at all."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body accepted; larger gets 413."""
    max_n: int = 16
    """Largest number of choices (n x prompts) one request may ask for."""
    warmup: bool = True
    """Run a tiny generation before reporting healthy."""
    log_level: str = "info"
    """debug, info, warning or error."""
    tui: bool = False
    """Show the terminal dashboard in this terminal; server logs go to log_file and a panel."""
    log_file: str | None = None
    """With --tui, the server log file; None = $XDG_STATE_HOME/llm-appliance/serve.log."""
    api_keys: list[ApiKey] = field(init=False, repr=False, default_factory=list)
    """The parsed keys of --api-key and --api-key-file (derived, not a flag)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        for name in ("drain_timeout", "request_timeout", "ttft_timeout", "stall_timeout"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0 seconds (0 = none)")
        for name in ("max_queue", "max_body_bytes", "max_n"):
            if getattr(self, name) < (0 if name == "max_queue" else 1):
                raise SettingsError(f"{name} is too small: {getattr(self, name)}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise SettingsError("TLS needs both --ssl-certfile and --ssl-keyfile")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise SettingsError(
                f"log_level must be debug, info, warning or error: {self.log_level}"
            )
        if self.load_format not in (None, "auto", "random"):
            raise SettingsError(f"load_format must be auto or random, got {self.load_format!r}")
        self.api_keys = self._load_keys()

    def _load_keys(self) -> list[ApiKey]:
        keys = [
            _parse_key(entry, ":", f"--api-key #{i}") for i, entry in enumerate(self.api_key, 1)
        ]
        if self.api_key_file:
            path = Path(self.api_key_file)
            try:
                lines = path.read_text().splitlines()
            except OSError as exc:
                raise SettingsError(f"cannot read --api-key-file {path}: {exc.strerror}") from None
            for lineno, line in enumerate(lines, 1):
                line = line.split("#", 1)[0].strip()
                if line:
                    keys.append(_parse_key(line, None, f"{path} line {lineno}"))
        return [ApiKey(k.name or f"key{i + 1}", k.key) for i, k in enumerate(keys)]

    @property
    def tui_log_path(self) -> Path:
        """Where `serve --tui` writes the server log."""
        if self.log_file:
            return Path(self.log_file)
        state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
        return Path(state) / "llm-appliance" / "serve.log"

    @property
    def is_loopback(self) -> bool:
        if self.host in ("localhost", "ip6-localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def bind_refusal(self) -> str | None:
        """Why this configuration must not start (non-loopback bind without keys), or None."""
        if self.is_loopback or self.api_keys or self.insecure_no_auth:
            return None
        return (
            f"refusing to listen on {self.host}: anyone on the network could use the model. "
            "Add a key with --api-key KEY (or --api-key-file FILE, or APPLIANCE_API_KEY=KEY), "
            "bind --host 127.0.0.1, or pass --insecure-no-auth if you really mean it."
        )

    def engine_kwargs(self) -> dict:
        """Engine settings the user pinned (None = let the engine decide)."""
        kwargs = {name: getattr(self, name) for name in ENGINE_FIELDS}
        kwargs["dtype"] = self.dtype
        return {k: v for k, v in kwargs.items() if v is not None}


def _parse_key(entry: str, sep: str | None, where: str) -> ApiKey:
    parts = entry.strip().split(sep, 1) if sep else entry.split(None, 1)
    name, key = (parts[0].strip(), parts[1].strip()) if len(parts) == 2 else ("", parts[0])
    if len(key) < 8 or any(c.isspace() for c in key):
        raise SettingsError(f"API key at {where} must be at least 8 characters without spaces")
    return ApiKey(name, key)


# --- merging --------------------------------------------------------------------------------
def load_settings(
    cli: dict | None = None, env: dict[str, str] | None = None, config_file: str | None = None
) -> ServeSettings:
    """Merge the sources: CLI flags (only those given) > APPLIANCE_* env > TOML file > defaults.

    The TOML file is `config_file`, else APPLIANCE_CONFIG; its keys are field names (dashes or
    underscores), at top level or under a [serve] table.
    """
    cli = dict(cli or {})
    env = dict(os.environ if env is None else env)
    hints = typing.get_type_hints(ServeSettings)
    known = {f.name for f in fields(ServeSettings) if f.init}
    merged: dict = {}
    path = config_file or cli.pop("config", None) or env.get(ENV_PREFIX + "CONFIG")
    if path:
        merged.update(_read_toml(Path(path), known))
    for name in known:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            merged[name] = _coerce(name, raw, hints[name], f"{ENV_PREFIX}{name.upper()}")
    for name, value in cli.items():
        if name not in known:
            raise SettingsError(f"unknown setting {name!r}")
        merged[name] = value
    if merged.get("profile"):
        for name, value in _tuned_values(str(merged["profile"])).items():
            merged.setdefault(name, value)
    for name, value in list(merged.items()):
        merged[name] = _check_type(name, value, hints[name])
    try:
        return ServeSettings(**merged)
    except TypeError as exc:
        raise SettingsError(str(exc)) from None


def _tuned_values(name_or_path: str) -> dict:
    from appliance.loadgen.profile import load_tuned_profile

    try:
        profile = load_tuned_profile(name_or_path)
    except (OSError, ValueError, KeyError) as exc:
        raise SettingsError(f"cannot load tuned profile {name_or_path!r}: {exc}") from None
    chosen = dict(profile.chosen)
    if "max_num_seqs" not in chosen and "max_concurrency" in chosen:
        chosen["max_num_seqs"] = chosen["max_concurrency"]
    return {k: chosen[k] for k in PROFILE_FIELDS if chosen.get(k) is not None}


def _read_toml(path: Path, known: set[str]) -> dict:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    data = {**{k: v for k, v in data.items() if k != "serve"}, **data.get("serve", {})}
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise SettingsError(f"config file {path}: unknown setting {key!r}")
        out[name] = value
    return out


def _base_types(hint) -> tuple[type, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for t in typing.get_args(hint) if t is not type(None))
    return (typing.get_origin(hint) or hint,)


def _coerce(name: str, raw: str, hint, where: str):
    base = _base_types(hint)[0]
    try:
        if base is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if base is list:
            return [part.strip() for part in raw.split(",") if part.strip()]
        return base(raw)
    except ValueError:
        raise SettingsError(f"{where}={raw!r} is not a valid {base.__name__}") from None


def _check_type(name: str, value, hint):
    allowed = _base_types(hint)
    if value is None and type(None) in typing.get_args(hint):
        return None
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if list in allowed and isinstance(value, str):
        return [value]
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = " or ".join(t.__name__ for t in allowed)
        raise SettingsError(f"setting {name} must be {names}, got {value!r}")
    return value


# --- engine flags for other commands ------------------------------------------------------------
def add_engine_flags(parser, names) -> None:
    """Flags for the engine settings `names` (EngineConfig fields), typed from EngineConfig;
    each defaults to None (= not pinned)."""
    from engine import config as engine_config

    hints = typing.get_type_hints(engine_config.EngineConfig)
    choices = {"dtype": engine_config._DTYPES, "kv_cache_dtype": engine_config._KV_DTYPES,
               "quantization": engine_config._QUANTIZATIONS}  # fmt: skip
    for name in names:
        flag = f"--{name.replace('_', '-')}"
        base = _base_types(hints[name])[0]
        if base is bool:
            parser.add_argument(flag, action="store_true", default=None, help="pin this setting")
        else:
            parser.add_argument(flag, type=base, choices=choices.get(name), help="pin this setting")


def engine_pins(args) -> dict:
    """The engine settings an argparse namespace pins (not None)."""
    from engine.config import EngineConfig

    names = {f.name for f in fields(EngineConfig)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}
