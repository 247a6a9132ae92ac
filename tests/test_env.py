"""Boolean environment variables (engine/env.py): one reading for the engine's switches and the
appliance's APPLIANCE_<SETTING> booleans."""

from __future__ import annotations

import importlib.util

import pytest

from appliance.options import SettingsError
from appliance.settings import load_settings
from engine.env import FALSE_WORDS, TRUE_WORDS, env_flag


@pytest.mark.parametrize("text", ["1", "true", "Yes", "ON", " on "])
def test_switches_on(text):
    assert env_flag("X", default=False, environ={"X": text}) is True


@pytest.mark.parametrize("text", ["0", "false", "No", "OFF", " 0 "])
def test_switches_off(text):
    assert env_flag("X", default=True, environ={"X": text}) is False


@pytest.mark.parametrize("environ", [{}, {"X": ""}, {"X": "  "}])
def test_unset_or_empty_is_the_default(environ):
    assert env_flag("X", default=True, environ=environ) is True
    assert env_flag("X", default=False, environ=environ) is False


def test_a_value_that_is_not_a_switch_names_the_variable_and_the_words():
    with pytest.raises(ValueError, match=r"X='maybe' is not a boolean: use 1/0, true/false"):
        env_flag("X", default=True, environ={"X": "maybe"})


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("APPLIANCE_TEST_SWITCH", "off")
    assert env_flag("APPLIANCE_TEST_SWITCH", default=True) is False


@pytest.mark.parametrize("text", [*TRUE_WORDS, *FALSE_WORDS, "maybe"])
def test_settings_read_booleans_as_the_engine_does(text):
    """An APPLIANCE_<SETTING> boolean takes exactly the words an engine switch takes."""
    env = {"APPLIANCE_ENFORCE_EAGER": text}
    if text == "maybe":
        with pytest.raises(SettingsError, match="APPLIANCE_ENFORCE_EAGER='maybe'"):
            load_settings({}, env=env)
        return
    assert load_settings({}, env=env).enforce_eager is (text in TRUE_WORDS)


def test_engine_switches_read_the_one_parser(monkeypatch):
    from engine.kernels import interpreting
    from engine.models import layers

    monkeypatch.setenv("TRITON_INTERPRET", "yes")
    assert interpreting()
    monkeypatch.setenv("TRITON_INTERPRET", "off")
    assert not interpreting()
    if importlib.util.find_spec("triton") is not None:
        from engine.kernels import pdl

        monkeypatch.setenv("APPLIANCE_PDL", "no")
        assert not pdl._switched_on()
        monkeypatch.setenv("APPLIANCE_PDL", "1")
        assert pdl._switched_on()
    layers.onednn_enabled.cache_clear()
    monkeypatch.setenv("APPLIANCE_CPU_ONEDNN", "false")
    try:
        assert not layers.onednn_enabled()
    finally:
        layers.onednn_enabled.cache_clear()
