"""The `appliance` command line: settings merged from flags, env and TOML; LAN-bind refusal;
subcommands of later issues say so."""

from __future__ import annotations

import subprocess
import sys

import pytest

from appliance.cli import main
from appliance.settings import ServeSettings, SettingsError, load_settings


def test_flags_beat_env_beat_file_beat_defaults(tmp_path):
    cfg = tmp_path / "appliance.toml"
    cfg.write_text('port = 9000\nmax-queue = 7\n[serve]\nhost = "127.0.0.2"\nstall_timeout = 5\n')
    env = {"APPLIANCE_PORT": "9100", "APPLIANCE_MAX_QUEUE": "9", "APPLIANCE_ENFORCE_EAGER": "yes"}
    s = load_settings({"port": 9200, "config": str(cfg)}, env=env)
    assert s.port == 9200  # flag
    assert s.max_queue == 9  # env over file
    assert s.host == "127.0.0.2" and s.stall_timeout == 5.0  # file
    assert s.enforce_eager is True and s.drain_timeout == 30.0  # env bool, default
    assert s.engine_kwargs() == {"enforce_eager": True}  # dtype unset: not pinned


def test_config_file_from_env_and_cli_lists(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('cors_origin = ["http://a.example"]\nmax_model_len = 512\n')
    s = load_settings(
        {}, env={"APPLIANCE_CONFIG": str(cfg), "APPLIANCE_API_KEY": "k1:abcdefgh1,abcdefgh2"}
    )
    assert s.cors_origin == ["http://a.example"] and s.max_model_len == 512
    assert [k.name for k in s.api_keys] == ["k1", "key2"]
    assert s.engine_kwargs()["max_model_len"] == 512


@pytest.mark.parametrize(
    "cli,env,message",
    [
        ({}, {"APPLIANCE_PORT": "eighty"}, "APPLIANCE_PORT='eighty' is not a valid int"),
        ({"port": 70000}, {}, "port must be in [0, 65535]"),
        ({"drain_timeout": -1.0}, {}, "drain_timeout must be >= 0"),
        ({"ssl_certfile": "c.pem"}, {}, "needs both --ssl-certfile and --ssl-keyfile"),
        ({"api_key": ["short"]}, {}, "at least 8 characters"),
        ({"api_key_file": "/nonexistent/keys"}, {}, "cannot read --api-key-file"),
        ({"max_queue": "lots"}, {}, "setting max_queue must be int"),
    ],
)
def test_bad_settings_say_what_is_wrong(cli, env, message):
    with pytest.raises(SettingsError) as info:
        load_settings(cli, env=env)
    assert message in str(info.value)


def test_unknown_key_in_config_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(SettingsError, match="unknown setting 'prot'"):
        load_settings({"config": str(cfg)}, env={})


def test_lan_bind_needs_a_key():
    assert ServeSettings().bind_refusal() is None
    assert ServeSettings(host="::1").bind_refusal() is None
    refusal = ServeSettings(host="0.0.0.0").bind_refusal()
    assert "--api-key" in refusal and "--insecure-no-auth" in refusal
    assert ServeSettings(host="0.0.0.0", api_key=["abcdefgh12"]).bind_refusal() is None
    assert ServeSettings(host="192.168.1.5", insecure_no_auth=True).bind_refusal() is None


def test_serve_refuses_lan_bind_without_key(capsys, monkeypatch):
    monkeypatch.delenv("APPLIANCE_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0" in err and "--api-key" in err


def test_bench_against_no_server_says_so(capsys, tmp_path):
    code = main(
        [
            "bench",
            "--url",
            "http://127.0.0.1:9",
            "--num-requests",
            "1",
            "--duration",
            "2s",
            "--no-progress",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_bench_results_go_to_the_users_data_folder_not_the_current_one(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("APPLIANCE_RESULTS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    argv = ["bench", "--url", "http://127.0.0.1:9", "--num-requests", "1", "--no-progress"]
    assert main([*argv, "--duration", "2s"]) == 1
    said = capsys.readouterr().out
    root = tmp_path / "data" / "llm-appliance" / "results"
    assert f"results go to {root}/bench-" in said
    assert not list(tmp_path.iterdir())  # nothing written in the current folder
    monkeypatch.setenv("APPLIANCE_RESULTS_DIR", str(tmp_path / "mine"))
    assert main([*argv, "--duration", "2s"]) == 1
    assert f"results go to {tmp_path / 'mine'}/bench-" in capsys.readouterr().out


def test_bad_settings_exit_2(capsys):
    assert main(["serve", "--port", "99999"]) == 2
    assert "port must be in" in capsys.readouterr().err


def test_python_dash_m_help():
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    flags = [
        "--max-queue",
        "--api-key-file",
        "--drain-timeout",
        "--ttft-timeout",
        "--log-requests",
        "--insecure-no-auth",
        "--ssl-certfile",
        "--cors-origin",
    ]
    for flag in flags:
        assert flag in out.stdout


def test_profile_plans_the_embedded_model_on_the_cpu(capsys):
    import json

    assert main(["profile", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4  # SmolLM2-135M, fp32
    assert out["engine_config"]["dtype"] == "float32"
