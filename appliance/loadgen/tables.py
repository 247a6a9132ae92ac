"""The console side of a bench run: the per-level table, each multi-turn level's per-turn
table and TTFT ratio line, and the line that sets the clients' cached tokens beside the
server's prefix-cache counters."""

from __future__ import annotations

from rich.table import Table

from appliance.loadgen.report import SLO, LevelSummary


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f}"


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"


def _prompt_and_cached(s: LevelSummary) -> str:
    """'2100/2000 (95.2%)': prompt and cached tokens per request, and the cached share."""
    if not s.num_ok:
        return "n/a"
    prompt, cached = s.num_prompt_tokens / s.num_ok, s.cached_tokens_mean
    return f"{prompt:.0f}/{cached:.0f} ({_percent(s.cache_hit_share)})"


def _clients_vs_server(s: LevelSummary) -> str:
    if s.server_output_tokens is None:
        return f"{s.num_output_tokens} / n/a"
    ratio = "n/a" if s.server_ratio is None else f"{s.server_ratio:.3f}"
    return f"{s.num_output_tokens} / {s.server_output_tokens} ({ratio})"


def table(summaries: list[LevelSummary], slo: SLO, title: str = "appliance bench") -> Table:
    t = Table(title=f"{title}  (SLO: {slo.describe()})")
    for name in (
        "load",
        "ok/sent",
        "errors",
        "TTFT ms p50/95/99",
        "TPOT ms p50/95/99",
        "ITL p50",
        "E2E p95 s",
        "prompt/cached tok/req",
        "req/s",
        "out tok/s",
        "out tok clients / server",
        "goodput req/s",
    ):
        t.add_column(name, justify="right" if name != "errors" else "left")
    for s in summaries:
        unit = "rps" if s.mode == "open" else "conc"
        e2e = s.get("e2e_s", "p95")
        t.add_row(
            f"{s.level:g} {unit}",
            f"{s.num_ok}/{s.num_requests}",
            ", ".join(f"{k}: {v}" for k, v in sorted(s.errors.items())) or "-",
            "/".join(_ms(s.get("ttft_s", p)) for p in ("p50", "p95", "p99")),
            "/".join(_ms(s.get("tpot_s", p)) for p in ("p50", "p95", "p99")),
            _ms(s.get("itl_s", "p50")),
            "n/a" if e2e is None else f"{e2e:.2f}",
            _prompt_and_cached(s),
            f"{s.request_throughput:.2f}",
            f"{s.output_token_throughput:.1f}",
            _clients_vs_server(s),
            f"{s.goodput:.2f} ({100 * s.goodput_frac:.0f}%)",
        )
    return t


def turn_table(s: LevelSummary) -> Table:
    """One row per turn of a multi-turn level."""
    unit = "rps" if s.mode == "open" else "conversations"
    t = Table(title=f"per turn at {s.level:g} {unit}")
    for name in ("turn", "ok/sent", "TTFT ms p50/90", "prompt tok/req", "cached tok (hit)"):
        t.add_column(name, justify="right")
    for turn in s.turns:
        t.add_row(
            str(turn.turn),
            f"{turn.num_ok}/{turn.num_requests}",
            f"{_ms(turn.ttft_p50_s)}/{_ms(turn.ttft_p90_s)}",
            "n/a" if turn.prompt_tokens_mean is None else f"{turn.prompt_tokens_mean:.1f}",
            f"{turn.num_cached_tokens} ({_percent(turn.cache_hit_share)})",
        )
    return t


def cache_line(s: LevelSummary) -> str | None:
    """The clients' cached prompt tokens (from the usage) beside the server's counters over the
    same level (None: the server reports no prefix-cache counters)."""
    if s.server_cached_tokens is None or s.server_cache_queries is None:
        return None
    unit = "rps" if s.mode == "open" else "conc"
    return (
        f"prefix cache at {s.level:g} {unit}: clients' usage {s.num_cached_tokens} of "
        f"{s.num_prompt_tokens} prompt tokens cached ({_percent(s.cache_hit_share)}); server "
        f"counters {s.server_cached_tokens} of {s.server_cache_queries} looked up "
        f"({_percent(s.server_cache_hit_share)})"
    )


def turn_ratio_line(s: LevelSummary) -> str | None:
    """'turn 8 / turn 1 TTFT: p50 1.23x, p90 1.41x' (None: not multi-turn)."""
    ratio = s.turn_ttft_ratio
    if ratio is None:
        return None
    parts = [f"{p} {'n/a' if ratio[p] is None else f'{ratio[p]:.2f}x'}" for p in ("p50", "p90")]
    return f"turn {ratio['last_turn']} / turn {ratio['first_turn']} TTFT: " + ", ".join(parts)
