"""How a user names several models: `--model NAME=PATH` (repeatable), `--models-dir DIR`, the
config file's `[models.NAME]` tables; a bare `--model PATH` still serves one model as before.
Admin keys: only they load and unload models when the server has keys."""

from __future__ import annotations

import json
import textwrap

import pytest

from appliance.cli import build_parser
from appliance.settings import ServeSettings, SettingsError, load_settings
from tests.support.fake_server import fake_client


def flags(*argv: str) -> dict:
    args = vars(build_parser().parse_args(["serve", *argv]))
    return {k: v for k, v in args.items() if k != "command" and v is not None}


def test_a_bare_model_serves_one_model_as_before():
    settings = load_settings(flags("--model", "/models/a"), env={})
    assert settings.model == "/models/a" and settings.model_specs == []
    assert load_settings({}, env={"APPLIANCE_MODEL": "/m"}).model == "/m"


def test_repeated_model_flags_name_a_registry_with_the_config_files_tables(tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text(
        textwrap.dedent("""
        [models.chat]
        pinned = true
        max_model_len = 2048
        aliases = ["gpt-*"]
        [models.small]
        keep_alive = 300
        quantization = "int8"
        gpu_memory_utilization = 0.95
        """)
    )
    cli = flags("--model", "chat=/m/chat", "--model", "small=/m/s.gguf", "--models-max", "2")
    settings = load_settings(cli, env={}, config_file=str(config))
    chat, small = settings.model_specs
    assert (chat.name, chat.path, chat.pinned, chat.aliases) == ("chat", "/m/chat", True, ["gpt-*"])
    assert (small.keep_alive, small.pinned, settings.models_max) == (300.0, False, 2)
    one = settings.for_model(small)
    assert (one.model, one.served_model_name, one.quantization) == ("/m/s.gguf", "small", "int8")
    assert one.gpu_memory_utilization == 0.95  # its share of the card, chat's included
    assert one.model_specs == [] and settings.for_model(chat).max_model_len == 2048


def test_models_dir_names_each_model_by_its_file(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text("{}")
    (tmp_path / "qwen.Q4.gguf").write_bytes(b"")
    (tmp_path / "notes").mkdir()  # no config.json: not a model
    settings = ServeSettings(models_dir=str(tmp_path), model="main=/m/main")
    assert [(s.name, s.path) for s in settings.model_specs] == [
        ("main", "/m/main"),
        ("llama", str(tmp_path / "llama")),
        ("qwen.Q4", str(tmp_path / "qwen.Q4.gguf")),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ["a=/x", "a=/y"]}, "given twice"),
        ({"model": ["a=/x"], "models": {"b": {}}}, "[models.b] names no served model"),
        ({"model": ["a=/x"], "models": {"a": {"pin": True}}}, "unknown key 'pin'"),
        ({"model": ["a=/x"], "models": {"a": {"keep_alive": 0}}}, "keep_alive must be > 0"),
        (
            {"model": ["a=/x"], "models": {"a": {"gpu_memory_utilization": 1.5}}},
            "gpu_memory_utilization must be in",
        ),
        ({"model": ["a=/x", "b=/y"], "api_workers": 2}, "drop --api-workers"),
        ({"model": ["a=/x", "b=/y"], "models_max": 0}, "models_max must be >= 1"),
        ({"model": "/x", "models": {"a": {}}}, "need --model NAME=PATH"),
        ({"models_dir": "/no/such/folder"}, "is not a folder"),
        ({"model": ["a=/x"], "models": {"a": {"quantization": "int3"}}}, "model 'a': setting"),
    ],
)
def test_bad_registry_settings_say_what_is_wrong(kwargs, message):
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ServeSettings(**kwargs)


async def test_only_admin_keys_load_and_unload_models():
    keys = {"api_key": ["user:sk-user-0123"], "admin_key": ["ops:sk-admin-0123"]}
    async with fake_client(**keys) as client:
        user = {"Authorization": "Bearer sk-user-0123"}
        admin = {"Authorization": "Bearer sk-admin-0123"}
        resp = await client.post("/v1/models/x/load", headers=user)
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "admin_key_required"
        resp = await client.post("/v1/models/x/unload", headers=admin)  # one model: no registry
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "no_model_registry"
        resp = await client.get("/v1/models", headers=admin)  # an admin key is a key too
        assert resp.status == 200 and "status" not in (await resp.json())["data"][0]


def test_profile_plans_several_models_in_order_each_into_what_the_others_leave(tmp_path, capsys):
    from appliance.cli import main
    from tests.support.tiny_models import make_tiny_model

    a = make_tiny_model("llama", tmp_path / "a")
    argv = ["profile", "--device", "cpu", "--json", "--model", f"x={a}", "--model", f"y={a}"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    x, y = report["models"]
    assert (x["model"], y["model"]) == ("x", "y")
    assert x["weight_bytes"] == y["weight_bytes"] > 0
    # y is planned into what x leaves: x's planned bytes count as used
    assert (x["earlier_models_bytes"], y["earlier_models_bytes"]) == (0, x["planned_bytes"])
    assert x["planned_bytes"] >= x["weight_bytes"] + x["kv_pool_bytes"]


def test_a_config_file_key_table_may_mark_a_key_admin(tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text('[keys.ops]\nkey = "sk-ops-0123"\nadmin = true\n[keys.user]\nrpm = 5\n')
    settings = load_settings(flags("--api-key", "user:sk-user-0123"), {}, str(config))
    assert {k.name: k.admin for k in settings.api_keys} == {"user": False, "ops": True}
    config.write_text('[keys.ops]\nkey = "sk-ops-0123"\nadmin = "yes"\n')
    with pytest.raises(SettingsError, match="admin must be true or false"):
        load_settings({}, {}, str(config))
