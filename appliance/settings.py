"""ServeSettings: the typed server configuration (the engine's settings, read from EngineConfig,
plus the server's own), and the one place that builds it from CLI flags, a TOML file and
APPLIANCE_* environment variables (flags > env > file > tuned profile > defaults).

The flags of `appliance serve` (`add_serve_flags`), its environment variables, its TOML keys
and the engine flags of other commands (`add_engine_flags`) are all made from the fields below
(appliance.options): a field added here or to EngineConfig needs no other edit.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator

from appliance.key_limits import ANONYMOUS, ApiKey, KeyLimits, parse_key, parse_words, with_tables
from appliance.model_specs import ModelSpec, is_registry, model_specs
from appliance.options import (
    ENV_PREFIX,
    Option,
    SettingsError,
    optional_settings,
    options_of,
    read_env,
)
from appliance.settings_files import read_toml, tuned_values
from engine.config import EngineConfig
from engine.multimodal.images import MAX_IMAGE_PIXELS
from engine.sampling_params import PRIORITIES

if TYPE_CHECKING:
    from appliance.generation_defaults import GenerationDefaults

EngineSettings = optional_settings(EngineConfig, "EngineSettings")
"""Every EngineConfig setting, optional: None = not pinned (the planner or the engine decides)."""

TUNABLE = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "adaptive_batching",
    "kv_cache_dtype",
    "quantization",
    "block_size",
)
"""Engine settings `appliance tune --sweep` may vary; the values a tuned profile chose for them
apply under `serve --profile` wherever no flag, variable or config file sets them."""


def _lower(value):
    return value.lower() if isinstance(value, str) else value


@dataclass
class ServeSettings(EngineSettings):
    """Everything `appliance serve` needs: the engine's settings (EngineSettings, from
    EngineConfig) and the server's own below. Field names are the CLI flags with dashes."""

    model: str | list[str] | None = field(
        default=None, metadata={"metavar": "[NAME=]PATH", "repeatable": True}
    )
    """Hugging Face model folder or .gguf file (with --load-format random also a preset name from
    profiles/models, served with the embedded tokenizer); None = the embedded
    SmolLM2-135M-Instruct. Repeat it as NAME=PATH to serve several models, loaded on demand
    (a registry: docs/operations.md)."""
    models_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    """Serve every model folder and .gguf file in DIR too, each named by its file name."""
    models_memory: float | None = field(default=None, metadata={"metavar": "GIB"})
    """With several models: the GiB their plans may take together (None = the device's memory,
    as the planner sees it); past it the least recently used unpinned idle model is unloaded."""
    models_max: int | None = None
    """With several models: the most that stay loaded at once (None = as many as fit)."""
    models: dict[str, dict] = field(default_factory=dict, repr=False, metadata={"toml_only": True})
    """The config file's `[models.NAME]` tables: each model's own settings (TOML only;
    appliance.model_specs.ModelSpec lists the keys)."""
    admin_key: list[str] = field(
        default_factory=list, repr=False, metadata={"metavar": "[NAME:]KEY"}
    )
    """API keys that may also load and unload models (POST /v1/models/{name}/load|unload);
    with API keys set, other keys may not."""
    served_model_name: str | None = None
    """Name clients use for the model; None = the engine's model name."""
    model_alias: list[str] = field(default_factory=list, metadata={"metavar": "NAME=SERVED"})
    """Another name clients may send for the served model, NAME=SERVED; NAME may be a glob
    ('claude-*=my-model' lets Claude Code's model names through). Every route reads it."""
    host: str = "127.0.0.1"
    """Address to bind. Non-loopback addresses need an API key (or --insecure-no-auth)."""
    port: int = 8000
    """TCP port to bind (0 = any free port)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """Where the engine runs."""
    profile: str | None = field(default=None, metadata={"metavar": "NAME"})
    """A tuned profile (name under profiles/tuned/ or a .toml path) written by `appliance tune`:
    its chosen values apply where no flag, variable or config file sets them."""
    max_queue: int = 128
    """Most requests waiting for a slot; past it requests get 429 with Retry-After."""
    api_key: list[str] = field(default_factory=list, repr=False, metadata={"metavar": "[NAME:]KEY"})
    """API keys accepted as `Authorization: Bearer KEY`, each `KEY` or `NAME:KEY`."""
    api_key_file: str | None = field(default=None, metadata={"metavar": "FILE"})
    """File of API keys, one per line: `KEY`, `NAME KEY` or `NAME KEY name=value ...` (limits:
    max_concurrent, rpm, tpm, priority, max_tokens, max_context); # starts a comment."""
    keys: dict[str, dict] = field(default_factory=dict, repr=False, metadata={"toml_only": True})
    """The config file's `[keys.NAME]` tables: `key = "..."` and limits; a table without `key`
    gives limits to the key of that name from --api-key or --api-key-file (TOML only)."""
    default_priority: Literal[PRIORITIES] = PRIORITIES[0]
    """Priority class of requests without an API key (when no keys are set)."""
    default_limits: str | None = field(default=None, metadata={"metavar": "LIMITS"})
    """Limits of requests without an API key, as words: e.g. "max_concurrent=4 rpm=60"
    (unset = unlimited)."""
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
    grammar_timeout: float = 10.0
    """Longest compile of a request's JSON schema, regex or grammar in seconds; past it the
    request gets a 400 (0 = none)."""
    log_requests: str | None = field(default=None, metadata={"metavar": "PATH"})
    """Append one JSON line per finished request to this file (written off the engine thread)."""
    ssl_certfile: str | None = field(default=None, metadata={"metavar": "PEM"})
    """TLS certificate (PEM); serve HTTPS when given with --ssl-keyfile."""
    ssl_keyfile: str | None = field(default=None, metadata={"metavar": "PEM"})
    """TLS private key (PEM)."""
    cors_origin: list[str] = field(default_factory=list, metadata={"metavar": "ORIGIN"})
    """Origins allowed by CORS ('*' for any); none = no CORS headers at all."""
    web: bool = True
    """Serve the chat page and live dashboard at / (--no-web: / answers 404)."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body accepted; larger gets 413."""
    max_n: int = 16
    """Largest number of choices (n x prompts) one request may ask for."""
    allow_image_urls: bool = False
    """Fetch images that requests send as http(s) URLs (never from private, loopback or
    link-local addresses; redirects are not followed); off: only data: URLs and base64 images
    are taken."""
    max_images_per_request: int = 8
    """Most images one request may send (to a model that reads images)."""
    max_image_pixels: int = MAX_IMAGE_PIXELS
    """Largest image in pixels (width x height), checked before it is decoded; larger gets 400."""
    warmup: bool = True
    """Run a tiny generation before reporting healthy."""
    tool_parser: str | None = field(default=None, metadata={"metavar": "FAMILY"})
    """How tool calls are read from the model's output (hermes, llama3_json, mistral); None =
    chosen from the model's chat template and type."""
    generation_config: str = field(default="auto", metadata={"metavar": "none|auto|PATH"})
    """Defaults for the temperature, top_p, top_k, repetition_penalty and max_tokens a request
    omits: auto = the model's generation_config.json (a .gguf: its general.sampling.* metadata),
    PATH = that file, a folder holding one, or a .gguf file, none = the server's own."""
    override_generation_config: str | None = field(default=None, metadata={"metavar": "JSON"})
    """Defaults that win over the model's, a JSON object of generation_config.json fields, e.g.
    '{"temperature": 0.6, "max_new_tokens": 512}'; a request's own values still win."""
    api_workers: int = 1
    """HTTP front-end processes sharing the port and the one engine (more when one event loop
    is the limit)."""
    log_level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = (
        "info"
    )
    """Server log level."""
    tui: bool = False
    """Show the terminal dashboard in this terminal; server logs go to log_file and a panel."""
    log_file: str | None = field(default=None, metadata={"metavar": "PATH"})
    """With --tui, the server log file; None = $XDG_STATE_HOME/llm-appliance/serve.log."""
    api_keys: list[ApiKey] = field(init=False, repr=False, default_factory=list)
    """The parsed keys of --api-key, --api-key-file and [keys.NAME] (derived, not a flag)."""
    anonymous_limits: KeyLimits = field(init=False, repr=False, default_factory=KeyLimits)
    """The limits of requests without a key: default_priority and default_limits (derived)."""
    generation_overrides: dict = field(init=False, repr=False, default_factory=dict)
    """--override-generation-config, checked, under request field names (derived)."""
    model_aliases: list[tuple[str, str]] = field(init=False, repr=False, default_factory=list)
    """--model-alias as (NAME, SERVED) pairs, in the order given (derived)."""
    model_specs: list[ModelSpec] = field(init=False, repr=False, default_factory=list)
    """The registry's models (derived from --model NAME=PATH, --models-dir and [models.NAME]);
    empty when one model is served (`model` is then one path or None, else the --model list)."""

    def __post_init__(self) -> None:
        for option in serve_options().values():
            setattr(self, option.name, option.check(getattr(self, option.name)))
        self._read_models()
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        for name in (
            "drain_timeout",
            "request_timeout",
            "ttft_timeout",
            "stall_timeout",
            "grammar_timeout",
        ):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0 seconds (0 = none)")
        for name in (
            "max_queue",
            "max_body_bytes",
            "max_n",
            "api_workers",
            "max_images_per_request",
            "max_image_pixels",
        ):
            if getattr(self, name) < (0 if name == "max_queue" else 1):
                raise SettingsError(f"{name} is too small: {getattr(self, name)}")
        if self.tool_parser is not None:
            from appliance.server.tools import PARSERS

            if self.tool_parser not in PARSERS:
                raise SettingsError(
                    f"tool_parser must be one of {', '.join(PARSERS)}, got {self.tool_parser!r}"
                )
        if self.tui and self.api_workers > 1:
            raise SettingsError("--tui runs one front end: drop --api-workers or --tui")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise SettingsError("TLS needs both --ssl-certfile and --ssl-keyfile")
        try:
            EngineConfig(**self.engine_kwargs())
        except ValueError as exc:
            raise SettingsError(f"engine setting: {exc}") from None
        self.api_keys = self._load_keys()
        from appliance.server.model_names import parse_alias

        try:
            self.model_aliases = [parse_alias(entry) for entry in self.model_alias]
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        words = (self.default_limits or "").split()
        limits = parse_words(words, ANONYMOUS, "--default-limits")
        if "priority" in {w.partition("=")[0] for w in words}:
            raise SettingsError("--default-limits: set the priority with --default-priority")
        self.anonymous_limits = replace(limits, priority=self.default_priority)
        from appliance.generation_defaults import check_source, parse_overrides

        check_source(self.generation_config)
        self.generation_overrides = parse_overrides(self.override_generation_config)

    def _read_models(self) -> None:
        entries = self.model if isinstance(self.model, list) else [self.model] * bool(self.model)
        if not is_registry(entries, self.models_dir):
            if self.models:
                raise SettingsError("[models.NAME] tables need --model NAME=PATH or --models-dir")
            self.model = entries[0] if entries else None
            return
        if self.api_workers > 1:
            raise SettingsError("several models run with one front end: drop --api-workers")
        if self.models_max is not None and self.models_max < 1:
            raise SettingsError(f"models_max must be >= 1, got {self.models_max}")
        if self.models_memory is not None and not self.models_memory > 0:
            raise SettingsError(f"models_memory must be > 0 GiB, got {self.models_memory}")
        default = self.served_model_name or "default"
        self.model_specs = model_specs(entries, self.models_dir, self.models, default)
        for spec in self.model_specs:  # each model's own settings are checked now, not at load
            try:
                self.for_model(spec)
            except SettingsError as exc:
                raise SettingsError(f"model {spec.name!r}: {exc}") from None

    def for_model(self, spec: ModelSpec) -> ServeSettings:
        """The settings of one registry model: these, serving `spec` with its own pins."""
        return replace(
            self,
            model=spec.path,
            served_model_name=spec.name,
            model_alias=[],
            models_dir=None,
            models={},
            models_max=None,
            models_memory=None,
            **spec.engine_pins,
        )

    def _load_keys(self) -> list[ApiKey]:
        keys = [parse_key(entry, ":", f"--api-key #{i}") for i, entry in enumerate(self.api_key, 1)]
        keys += [
            replace(parse_key(entry, ":", f"--admin-key #{i}"), admin=True)
            for i, entry in enumerate(self.admin_key, 1)
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
                    keys.append(parse_key(line, None, f"{path} line {lineno}"))
        keys = [replace(k, name=k.name or f"key{i + 1}") for i, k in enumerate(keys)]
        return with_tables(keys, self.keys)

    @functools.cached_property
    def generation_defaults(self) -> GenerationDefaults:
        """Requests' defaults for omitted sampling fields, read once (the model's file and the
        overrides); raises SettingsError when the file cannot be read."""
        from appliance.generation_defaults import load_generation_defaults

        model = None if self.model_specs else self.model  # a registry: each model reads its own
        return load_generation_defaults(self.generation_config, model, self.generation_overrides)

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
        """Engine settings the user pinned (None = let the planner or the engine decide)."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(EngineSettings)}
        return {k: v for k, v in kwargs.items() if v is not None}


# --- the description's other forms: flags, environment, TOML ---------------------------------
@functools.cache
def serve_options() -> dict[str, Option]:
    """Every setting of `appliance serve`, by field name."""
    return options_of(ServeSettings)


@functools.cache
def engine_options() -> dict[str, Option]:
    """The engine's settings (EngineConfig's fields), by name, each optional."""
    return options_of(EngineSettings)


def add_engine_flags(parser: argparse.ArgumentParser, names: Iterable[str] | None = None) -> None:
    """Add the flags of the engine settings `names` (all of them when None), as `serve` has
    them: `--max-num-seqs N`, `--dtype {auto,...}`, `--enforce-eager/--no-enforce-eager`; an
    unset flag leaves the parser's default (None unless the parser says otherwise)."""
    options = engine_options()
    unknown = sorted(set(names or ()) - set(options))
    if unknown:
        raise ValueError(f"not engine settings: {unknown}; known: {sorted(options)}")
    for name in options if names is None else names:
        options[name].add_flag(parser)


def engine_pins(args: argparse.Namespace) -> dict:
    """The engine settings a namespace from add_engine_flags pins (those not None)."""
    return {n: v for n in engine_options() if (v := getattr(args, n, None)) is not None}


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every ServeSettings field: the server's own, then the engine's."""
    engine = engine_options()
    for name, option in serve_options().items():
        if name not in engine:
            option.add_flag(parser)
    group = parser.add_argument_group(
        "engine settings", "Unset = planned from the device's memory, else the engine's default."
    )
    add_engine_flags(group)


def load_settings(
    cli: dict | None = None, env: dict[str, str] | None = None, config_file: str | None = None
) -> ServeSettings:
    """Merge the sources: CLI flags (only those given) > APPLIANCE_* env > TOML file > the
    tuned profile (--profile) > defaults.

    The TOML file is `config_file`, else the `config` flag, else APPLIANCE_CONFIG; its keys are
    field names (dashes or underscores), at top level or under a [serve] table.
    """
    cli = dict(cli or {})
    env = dict(os.environ if env is None else env)
    known = serve_options()
    merged: dict = {}
    path = config_file or cli.pop("config", None) or env.get(ENV_PREFIX + "CONFIG")
    if path:
        merged.update(read_toml(Path(path), known, _toml_tables()))
    merged.update(read_env(known.values(), env))
    for name, value in cli.items():
        if name not in known:
            raise SettingsError(f"unknown setting {name!r}")
        merged[name] = value
    if merged.get("profile"):
        for name, value in tuned_values(str(merged["profile"]), TUNABLE).items():
            merged.setdefault(name, value)
    return ServeSettings(**merged)


@functools.cache
def _toml_tables() -> frozenset[str]:
    """The settings only the config file sets, as tables (fields marked toml_only)."""
    return frozenset(f.name for f in fields(ServeSettings) if f.metadata.get("toml_only"))
