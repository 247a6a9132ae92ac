"""Settings described once: every EngineConfig field is a `serve` flag, an APPLIANCE_* variable
and a TOML key with EngineConfig's docstring and choices; values are checked against the
field's type (text leniently, typed values strictly) with errors that name the setting."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest

from appliance.cli import build_parser, main
from appliance.options import attribute_docs
from appliance.settings import (
    TUNABLE,
    SettingsError,
    add_engine_flags,
    engine_options,
    load_settings,
)
from engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[1]


def serve_args(*argv: str) -> dict:
    args = vars(build_parser().parse_args(["serve", *argv]))
    return {k: v for k, v in args.items() if k != "command"}


def test_every_engine_field_is_a_flag_with_the_engines_docstring_and_choices():
    names = [f.name for f in fields(EngineConfig)]
    assert list(engine_options()) == names
    docs = attribute_docs(EngineConfig)
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    by_dest = {a.dest: a for a in serve._actions}
    for name in names:
        action = by_dest[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert action.help.startswith(docs[name].replace("%", "%%"))
    for name, allowed in EngineConfig.CHOICES.items():
        assert tuple(by_dest[name].choices) == allowed


def test_engine_flags_reach_engine_kwargs_and_unset_ones_do_not():
    flags = serve_args(
        "--max-num-seqs",
        "12",
        "--dtype",
        "float16",
        "--no-overlap-steps",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.5",
    )
    kwargs = load_settings(flags, env={}).engine_kwargs()
    assert kwargs == {
        "max_num_seqs": 12,
        "dtype": "float16",
        "overlap_steps": False,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.5,
    }
    assert EngineConfig(**kwargs).max_num_seqs == 12
    assert load_settings({}, env={}).engine_kwargs() == {}


def test_environment_text_is_read_by_type():
    env = {
        "APPLIANCE_ADAPTIVE_BATCHING": "on",
        "APPLIANCE_WARMUP": "0",
        "APPLIANCE_CORS_ORIGIN": "http://a.example, http://b.example",
        "APPLIANCE_GPU_MEMORY_UTILIZATION": "0.5",
        "APPLIANCE_LOG_LEVEL": "DEBUG",
        "APPLIANCE_SEED": "",
    }
    s = load_settings({}, env=env)
    assert s.adaptive_batching is True and s.warmup is False and s.log_level == "debug"
    assert s.cors_origin == ["http://a.example", "http://b.example"]
    assert s.gpu_memory_utilization == 0.5 and s.seed is None  # an empty variable is unset


@pytest.mark.parametrize(
    "cli,env,toml,message",
    [
        (
            {},
            {"APPLIANCE_KV_CACHE_DTYPE": "fp8"},
            "",
            "kv_cache_dtype must be auto, float32, float16, bfloat16 or int8",
        ),
        (
            {},
            {"APPLIANCE_ENFORCE_EAGER": "maybe"},
            "",
            "ENFORCE_EAGER='maybe' is not a boolean: use 1/0, true/false, yes/no or on/off",
        ),
        ({}, {}, "max_num_seqs = 1.5\n", "setting max_num_seqs must be int, got 1.5"),
        (
            {},
            {},
            "quantization = 4\n",
            "setting quantization must be none, int8, int4, fp8 or auto",
        ),
        ({"port": True}, {}, "", "setting port must be int, got True"),
        ({"gpu_memory_utilization": 1.5}, {}, "", "gpu_memory_utilization must be in (0, 1]"),
        ({"quant_block_size": 3}, {}, "", "quant_block_size must be even"),
    ],
)
def test_bad_values_name_the_setting_and_what_is_allowed(tmp_path, cli, env, toml, message):
    if toml:
        (tmp_path / "c.toml").write_text(toml)
        cli = {**cli, "config": str(tmp_path / "c.toml")}
    with pytest.raises(SettingsError) as info:
        load_settings(cli, env=env)
    assert message in str(info.value)


def test_a_bad_flag_value_says_what_is_allowed(capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--max-num-seqs", "many"])
    assert info.value.code == 2
    assert "--max-num-seqs: invalid value 'many': must be int" in capsys.readouterr().err


def test_add_engine_flags_builds_pin_flags_for_another_command():
    parser = argparse.ArgumentParser()
    add_engine_flags(parser, ["max_num_seqs", "kv_cache_dtype", "enforce_eager"])
    assert vars(parser.parse_args([])) == {
        "max_num_seqs": None,
        "kv_cache_dtype": None,
        "enforce_eager": None,
    }
    args = parser.parse_args(["--max-num-seqs", "8", "--kv-cache-dtype", "int8", "--enforce-eager"])
    assert (args.max_num_seqs, args.kv_cache_dtype, args.enforce_eager) == (8, "int8", True)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8"])
    with pytest.raises(ValueError, match="not engine settings: \\['port'\\]"):
        add_engine_flags(argparse.ArgumentParser(), ["port"])


def test_tunable_settings_are_engine_settings():
    assert set(TUNABLE) <= set(engine_options())


EXTENDED = '''
import dataclasses, json, sys
import engine.config


@dataclasses.dataclass
class Extended(engine.config.EngineConfig):
    CHOICES = {**engine.config.EngineConfig.CHOICES, "spec_method": ("none", "ngram")}

    prefix_caching: bool = False
    """Reuse the KV blocks of shared prompt prefixes."""
    spec_method: str = "none"
    """Speculative decoding method."""
    spec_tokens: int = 4
    """Tokens proposed per step."""


engine.config.EngineConfig = Extended
from appliance.cli import build_parser
from appliance.settings import SettingsError, load_settings

toml, help_path = sys.argv[1], sys.argv[2]
parser = build_parser()
args = vars(parser.parse_args(["serve", "--prefix-caching", "--spec-method", "ngram"]))
del args["command"]
out = {"flags": load_settings(args, env={}).engine_kwargs(),
       "env": load_settings({}, env={"APPLIANCE_SPEC_TOKENS": "7"}).engine_kwargs(),
       "toml": load_settings({"config": toml}, env={}).engine_kwargs()}
try:
    load_settings({}, env={"APPLIANCE_SPEC_METHOD": "medusa"})
except SettingsError as exc:
    out["error"] = str(exc)
with open(help_path, "w") as f:
    f.write(parser._subparsers._group_actions[0].choices["serve"].format_help())
print(json.dumps(out))
'''


def test_a_field_added_to_engine_config_needs_no_other_edit(tmp_path):
    """A new EngineConfig field (a subclass stands in for an edited engine/config.py) becomes a
    flag, a variable and a TOML key, with its docstring as help and its CHOICES as choices."""
    script = tmp_path / "extended.py"
    script.write_text(textwrap.dedent(EXTENDED))
    (tmp_path / "c.toml").write_text("[serve]\nspec-tokens = 2\nprefix_caching = true\n")
    help_path = tmp_path / "help.txt"
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "c.toml"), str(help_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["flags"] == {"prefix_caching": True, "spec_method": "ngram"}
    assert out["env"] == {"spec_tokens": 7}
    assert out["toml"] == {"spec_tokens": 2, "prefix_caching": True}
    assert out["error"] == "APPLIANCE_SPEC_METHOD='medusa': spec_method must be none or ngram"
    text = " ".join(help_path.read_text().split())
    assert "--prefix-caching, --no-prefix-caching Reuse the KV blocks of shared prompt" in text
    assert "--spec-method {none,ngram} Speculative decoding method." in text
    assert "--max-num-seqs N Most sequences running" in text  # the base class's docstrings
