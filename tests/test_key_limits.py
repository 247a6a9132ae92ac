"""Per-key limits without HTTP: the Limiter's concurrency, RPM and TPM windows, its Retry-After
and x-ratelimit-* values, releases at every ending, the caps; and the settings that give keys
their limits (key file lines, [keys.NAME] tables, --default-limits) with their errors."""

from __future__ import annotations

import pytest

from appliance.key_limits import KeyLimits
from appliance.options import SettingsError
from appliance.server.limits import Limiter, Refusal, capped_max_tokens, duration
from appliance.settings import ServeSettings, load_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(**limits) -> tuple[Limiter, Clock]:
    clock = Clock()
    return Limiter({"k": KeyLimits(**limits), "other": KeyLimits()}, clock), clock


def refusal(lim: Limiter, prompt: int = 1, hint: float = 1.0) -> Refusal:
    with pytest.raises(Refusal) as info:
        lim.admit("k", prompt, hint)
    assert info.value.status == 429
    return info.value


def test_concurrency_is_held_until_release_and_other_keys_pass():
    lim, _ = limiter(max_concurrent=2)
    a, b = lim.admit("k", 5), lim.admit("k", 5)
    err = refusal(lim, hint=7.2)
    assert err.code == "concurrency_limit" and err.headers["Retry-After"] == "8"
    assert "2 concurrent requests" in err.message
    lim.admit("other", 5)  # another key is not limited by this one
    a.release(3)
    a.release(3)  # a second release (finally after an error path) frees nothing more
    assert lim.running("k") == 1
    lim.admit("k", 5)
    assert lim.running("k") == 2
    refusal(lim)
    b.release(0)
    assert lim.running("k") == 1


def test_every_ending_releases_the_slot():
    """Finished, error, timeout and disconnect all end in release(); a server refusal after the
    key admitted ends in refund(); either way the slot comes back and nothing leaks."""
    lim, _ = limiter(max_concurrent=1, rpm=10)
    for end in ("finished", "error", "cancelled", "refund"):
        ticket = lim.admit("k", 2)
        refusal(lim)
        if end == "refund":
            ticket.refund()
        else:
            ticket.release(4 if end == "finished" else 0)
        assert lim.running("k") == 0
    # the refunded request is not counted in the window; the three others are
    assert lim.headers("k")["x-ratelimit-remaining-requests"] == "7"


def test_rpm_slides_over_60_s_and_retry_after_says_when():
    lim, clock = limiter(rpm=3)
    for dt in (0.0, 10.0, 20.0):
        clock.now += dt
        lim.admit("k", 1).release(0)
    err = refusal(lim)
    assert err.code == "requests_per_minute"
    # the first admission (30 s ago) leaves the window in 30 s
    assert err.headers["Retry-After"] == "30"
    assert err.headers["x-ratelimit-remaining-requests"] == "0"
    clock.now += 29.5
    refusal(lim)
    clock.now += 0.5
    lim.admit("k", 1)


def test_tpm_counts_prompt_at_admission_and_output_at_the_end():
    lim, clock = limiter(tpm=100)
    t = lim.admit("k", 30)
    assert lim.headers("k")["x-ratelimit-remaining-tokens"] == "70"
    clock.now += 5
    t.release(50)  # output charged when the request ends
    assert lim.headers("k")["x-ratelimit-remaining-tokens"] == "20"
    err = refusal(lim, prompt=40)
    assert err.code == "tokens_per_minute" and "100 tokens per minute" in err.message
    # 40 more fit once the prompt's 30 (admitted at t=0) age out: 60 s after, 55 s from now
    assert err.headers["Retry-After"] == "55"
    lim.admit("k", 20)  # what is left still fits
    clock.now += 55
    lim.admit("k", 30)


def test_prompt_larger_than_the_tpm_limit_can_never_pass():
    lim, _ = limiter(tpm=100)
    err = refusal(lim, prompt=101)
    assert "Retry-After" not in err.headers and "shorter prompt" in err.message


def test_several_limits_past_name_each_and_wait_for_the_longest():
    lim, clock = limiter(max_concurrent=1, rpm=1, tpm=10)
    lim.admit("k", 10)
    clock.now += 15
    err = refusal(lim, prompt=5, hint=2.0)
    assert err.code == "rate_limit_exceeded"
    for what in ("concurrent", "requests per minute", "tokens per minute"):
        assert what in err.message
    assert err.headers["Retry-After"] == "45"


def test_headers_report_limit_remaining_and_reset():
    lim, clock = limiter(rpm=10, tpm=1000)
    assert lim.headers("other") == {}  # no RPM/TPM: no headers
    lim.admit("k", 100)
    clock.now += 0.75
    h = lim.headers("k")
    assert h == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "59.2s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "59.2s",
    }
    clock.now += 60
    assert lim.headers("k")["x-ratelimit-remaining-tokens"] == "1000"
    assert lim.headers("k")["x-ratelimit-reset-requests"] == "0ms"


def test_duration_is_written_as_openai_does():
    assert [duration(s) for s in (0.25, 12.46, 60.0, 125.0)] == ["250ms", "12.5s", "1m0s", "2m5s"]


def test_caps_refuse_or_clamp():
    caps = KeyLimits(max_tokens=64, max_context=100)
    assert capped_max_tokens(caps, 10, 50) == 10
    assert capped_max_tokens(caps, None, 10) == 64  # omitted: clamped to the cap
    assert capped_max_tokens(caps, None, 80) == 20  # ... and to what the context cap leaves
    assert capped_max_tokens(KeyLimits(), None, 80) is None
    with pytest.raises(Refusal) as info:
        capped_max_tokens(caps, 65, 10)
    assert info.value.status == 400 and info.value.param == "max_tokens"
    assert "cap (max_tokens) of 64" in info.value.message
    with pytest.raises(Refusal) as info:
        capped_max_tokens(caps, 30, 80)
    assert "context cap (max_context) is 100" in info.value.message
    with pytest.raises(Refusal, match="shorten the prompt"):
        capped_max_tokens(caps, None, 100)


# --- settings --------------------------------------------------------------------------------
def test_key_file_lines_old_and_new(tmp_path):
    path = tmp_path / "keys"
    path.write_text(
        "sk-plain-01234567\n"
        "bob sk-bob-0123456789  # comment\n"
        "alice sk-alice-0123456 max_concurrent=2 rpm=60 tpm=1000 priority=batch "
        "max_tokens=64 max_context=512\n"
    )
    keys = ServeSettings(api_key_file=str(path)).api_keys
    assert [(k.name, k.key) for k in keys] == [
        ("key1", "sk-plain-01234567"),
        ("bob", "sk-bob-0123456789"),
        ("alice", "sk-alice-0123456"),
    ]
    assert keys[0].limits == keys[1].limits == KeyLimits()
    assert keys[2].limits == KeyLimits(2, 60, 1000, "batch", 64, 512)


def test_weight_is_a_positive_number_in_key_files_and_tables(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice sk-alice-0123456 weight=2.5\nbob sk-bob-0123456789\n")
    config = tmp_path / "serve.toml"
    config.write_text(f'api-key-file = "{path}"\n[keys.bob]\nweight = 3\n')
    by_name = {k.name: k for k in load_settings(config_file=str(config), env={}).api_keys}
    assert by_name["alice"].limits.weight == 2.5
    assert by_name["bob"].limits.weight == 3.0
    assert KeyLimits().weight == 1.0


def test_toml_key_tables(tmp_path):
    (tmp_path / "keys").write_text("bob sk-bob-0123456789\n")
    config = tmp_path / "serve.toml"
    config.write_text(
        f'api-key-file = "{tmp_path / "keys"}"\n'
        "default-priority = 'batch'\ndefault-limits = 'rpm=30'\n"
        '[keys.carol]\nkey = "sk-carol-0123456"\nrpm = 5\npriority = "batch"\n'
        "[keys.bob]\nmax-concurrent = 3\n"
    )
    s = load_settings(config_file=str(config), env={})
    by_name = {k.name: k for k in s.api_keys}
    assert by_name["carol"].key == "sk-carol-0123456"
    assert by_name["carol"].limits == KeyLimits(rpm=5, priority="batch")
    assert by_name["bob"].limits == KeyLimits(max_concurrent=3)
    assert s.anonymous_limits == KeyLimits(rpm=30, priority="batch")


@pytest.mark.parametrize(
    "line, message",
    [
        ("alice sk-alice-0123456 rpm=0", "key 'alice': rpm must be a positive integer, got '0'"),
        ("alice sk-alice-0123456 priority=urgent", "priority must be interactive or batch"),
        ("alice sk-alice-0123456 burst=3", "unknown limit 'burst'; allowed: max_concurrent"),
        ("alice sk-alice-0123456 rpm", "'rpm' is not a limit; write name=value"),
        ("alice sk-alice-0123456 rpm=1 rpm=2", "rpm is given twice"),
        ("sk-alice-0123456 rpm=5", "a key with limits needs a name"),
        ("alice sk-alice-0123456 weight=0", "weight must be a positive number, got '0'"),
        ("alice sk-alice-0123456 weight=lots", "weight must be a positive number, got 'lots'"),
    ],
)
def test_key_file_errors_name_the_key_and_field(tmp_path, line, message):
    path = tmp_path / "keys"
    path.write_text(line + "\n")
    with pytest.raises(SettingsError, match="line 1") as info:
        ServeSettings(api_key_file=str(path))
    assert message in str(info.value)


@pytest.mark.parametrize(
    "table, message",
    [
        ("[keys.dave]\nrpm = 5\n", 'no key = "..." and no --api-key'),
        ('[keys.carol]\nkey = "sk-carol-0123456"\ntpm = -1\n', "key 'carol': tpm must be"),
        ('[keys.carol]\nkey = "sk-carol-0123456"\nrpm = "many"\n', "rpm must be a positive"),
        ("[keys.anonymous]\nrpm = 5\n", "default-limits and default-priority"),
        ('[keys.carol]\nkey = "short"\n', "at least 8 characters"),
    ],
)
def test_toml_key_table_errors(tmp_path, table, message):
    config = tmp_path / "serve.toml"
    config.write_text(table)
    with pytest.raises(SettingsError, match=r"\[keys\.") as info:
        load_settings(config_file=str(config), env={})
    assert message in str(info.value)


def test_default_limits_errors():
    with pytest.raises(SettingsError, match="--default-priority"):
        ServeSettings(default_limits="priority=batch")
    with pytest.raises(SettingsError, match="key 'anonymous': rpm must be a positive integer"):
        ServeSettings(default_limits="rpm=x")
    with pytest.raises(SettingsError, match="default_priority must be interactive or batch"):
        ServeSettings(default_priority="urgent")


def test_duplicate_key_names_are_refused():
    with pytest.raises(SettingsError, match="unique.*'a'"):
        ServeSettings(api_key=["a:sk-one-0123456", "a:sk-two-0123456"])


def test_check_refuses_a_key_already_past_its_limits_without_admitting():
    lim, _ = limiter(max_concurrent=1, tpm=50)
    lim.check("k")  # nothing used: passes, admits nothing
    assert lim.running("k") == 0
    ticket = lim.admit("k", 10)
    with pytest.raises(Refusal, match="1 concurrent requests"):
        lim.check("k")
    ticket.release(45)  # 55 tokens in the window: past the TPM limit with no prompt at all
    with pytest.raises(Refusal, match=r"50 tokens per minute \(55 used in the last minute\)"):
        lim.check("k")
