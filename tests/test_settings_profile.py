"""`appliance serve --profile NAME`: a tuned profile's chosen values apply below the user's."""

from __future__ import annotations

import pytest

from appliance.loadgen.profile import TunedProfile, write_tuned_profile
from appliance.settings import SettingsError, load_settings


@pytest.fixture
def profile_path(tmp_path):
    prof = TunedProfile(
        name="cpu-smol",
        hardware={"gpu": "cpu"},
        model={"name": "SmolLM2-135M-Instruct", "dtype": "float32", "quantization": "none"},
        chosen={
            "max_concurrency": 6,
            "max_num_seqs": 6,
            "max_num_batched_tokens": 1024,
            "adaptive_batching": True,
        },
        slo={"tpot_s": 0.15, "percentile": 95.0},
    )
    return write_tuned_profile(prof, tmp_path)


def test_profile_values_apply_where_nothing_else_is_set(profile_path):
    settings = load_settings({"profile": str(profile_path)}, env={})
    kwargs = settings.engine_kwargs()
    assert kwargs["max_num_seqs"] == 6
    assert kwargs["max_num_batched_tokens"] == 1024
    assert kwargs["adaptive_batching"] is True


def test_flags_and_environment_win_over_the_profile(profile_path):
    settings = load_settings(
        {"profile": str(profile_path), "max_num_seqs": 3},
        env={"APPLIANCE_MAX_NUM_BATCHED_TOKENS": "512"},
    )
    assert settings.max_num_seqs == 3 and settings.max_num_batched_tokens == 512


def test_unknown_profile_names_the_known_ones(tmp_path):
    with pytest.raises(SettingsError, match="cannot load tuned profile 'nope'.*known"):
        load_settings({"profile": "nope"}, env={})


def test_engine_accepts_the_profile_settings(profile_path):
    from engine.config import EngineConfig

    cfg = EngineConfig(**load_settings({"profile": str(profile_path)}, env={}).engine_kwargs())
    assert cfg.adaptive_batching and cfg.max_num_seqs == 6


def test_a_swept_setting_the_profile_chose_applies_and_recorded_limits_do_not(tmp_path):
    prof = TunedProfile(
        name="swept",
        chosen={"max_concurrency": 4, "kv_cache_dtype": "int8", "max_model_len": 2048},
    )
    path = write_tuned_profile(prof, tmp_path)
    kwargs = load_settings({"profile": str(path)}, env={}).engine_kwargs()
    assert kwargs == {"max_num_seqs": 4, "kv_cache_dtype": "int8"}
