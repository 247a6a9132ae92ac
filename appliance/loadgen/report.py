"""Bench figures: SLO parsing, per-level summaries (percentiles, throughput, goodput, error
counts, prompt tokens served from the prefix cache), per-turn figures of multi-turn runs, the
rich tables and the JSON document."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from appliance.loadgen.client import RequestResult
from appliance.loadgen.runner import StageResult, StatsSample

METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, "m": 60.0, "h": 3600.0, "": 1.0}


def parse_duration(text: str) -> float:
    """Seconds of '500ms', '1.5s', '10m', '2h' or a bare number of seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|us|s|m|h)?\s*", text)
    if not match:
        raise ValueError(f"bad duration {text!r}: use e.g. 500ms, 2s, 10m")
    return float(match.group(1)) * _UNITS[match.group(2) or ""]


@dataclass(frozen=True)
class SLO:
    """Latency limits a request must meet to count as goodput; None: no limit."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    percentile: float = 95.0
    """The percentile that `tune` holds to the limits."""

    @classmethod
    def parse(cls, text: str, percentile: float = 95.0) -> SLO:
        """'ttft=500ms,tpot=50ms[,e2e=10s]'."""
        limits: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            if key not in ("ttft", "tpot", "e2e") or not value:
                raise ValueError(f"bad SLO {part!r}: use ttft=500ms,tpot=50ms,e2e=10s")
            limits[f"{key}_s"] = parse_duration(value)
        return cls(**limits, percentile=percentile)

    def limits(self) -> dict[str, float]:
        return {
            k: v
            for k, v in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s), ("e2e_s", self.e2e_s))
            if v is not None
        }

    def met_by(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        values = {"ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "e2e_s": r.e2e_s}
        return all(values[k] is None or values[k] <= v for k, v in self.limits().items())

    def describe(self) -> str:
        parts = [f"{k[:-2]}<={v * 1000:g}ms" for k, v in self.limits().items()]
        return ", ".join(parts) or "none"


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(-(-q * len(s) // 100)) - 1))]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass
class TurnSummary:
    """The requests of one turn of a multi-turn run (turn 1: every conversation's first)."""

    turn: int
    num_requests: int
    num_ok: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    num_prompt_tokens: int
    """Prompt tokens of the successful requests, from the usage."""
    num_cached_tokens: int
    """Of those, the ones the server reused from its prefix cache."""

    @property
    def prompt_tokens_mean(self) -> float | None:
        return self.num_prompt_tokens / self.num_ok if self.num_ok else None

    @property
    def cache_hit_share(self) -> float | None:
        return _share(self.num_cached_tokens, self.num_prompt_tokens)

    def to_json(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "prompt_tokens_mean": self.prompt_tokens_mean,
            "cache_hit_share": self.cache_hit_share,
        }


def summarize_turns(results: list[RequestResult]) -> list[TurnSummary]:
    """Per-turn figures of the conversations' requests (empty for single requests)."""
    out = []
    for turn in sorted({r.turn for r in results if r.turn is not None}):
        rs = [r for r in results if r.turn == turn]
        ok = [r for r in rs if r.ok]
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        out.append(
            TurnSummary(
                turn=turn,
                num_requests=len(rs),
                num_ok=len(ok),
                ttft_p50_s=percentile(ttfts, 50),
                ttft_p90_s=percentile(ttfts, 90),
                num_prompt_tokens=sum(r.num_prompt_tokens or 0 for r in ok),
                num_cached_tokens=sum(r.num_cached_tokens for r in ok),
            )
        )
    return out


@dataclass
class LevelSummary:
    """The figures of all requests sent at one load level."""

    level: float
    mode: str
    num_requests: int
    num_ok: int
    errors: dict[str, int]
    wall_s: float
    request_throughput: float
    """Successful requests per second of wall time."""
    output_token_throughput: float
    input_token_throughput: float
    goodput: float
    """Requests per second that met every SLO limit."""
    goodput_frac: float
    latency: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """metric -> {p50, p90, p95, p99, mean}."""
    num_output_tokens: int = 0
    """Output tokens the clients received (successful requests)."""
    server_output_tokens: int | None = None
    """Tokens the server's own counter says it generated over the stage (None: not reported,
    or a ramp step, which the counter cannot tell apart)."""
    num_prompt_tokens: int = 0
    """Prompt tokens of the successful requests (the usage's, else the client's count)."""
    num_cached_tokens: int = 0
    """Of those, the ones the server reused from its prefix cache (the usage's cached_tokens)."""
    turns: list[TurnSummary] = field(default_factory=list)
    """Multi-turn runs: the figures of each turn."""

    @property
    def cached_tokens_mean(self) -> float | None:
        """Cached prompt tokens per successful request."""
        return self.num_cached_tokens / self.num_ok if self.num_ok else None

    @property
    def cache_hit_share(self) -> float | None:
        """Cached / prompt tokens of the successful requests."""
        return _share(self.num_cached_tokens, self.num_prompt_tokens)

    @property
    def turn_ttft_ratio(self) -> dict | None:
        """The last turn's TTFT over the first turn's, at p50 and p90 (None: not multi-turn,
        or a turn without a successful request)."""
        if len(self.turns) < 2:
            return None
        first, last = self.turns[0], self.turns[-1]
        ratios = {}
        for pct in ("p50", "p90"):
            a, b = getattr(first, f"ttft_{pct}_s"), getattr(last, f"ttft_{pct}_s")
            ratios[pct] = b / a if a and b is not None else None
        return {"first_turn": first.turn, "last_turn": last.turn, **ratios}

    def to_json(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "turns": [t.to_json() for t in self.turns],
            "server_ratio": self.server_ratio,
            "cached_tokens_mean": self.cached_tokens_mean,
            "cache_hit_share": self.cache_hit_share,
            "turn_ttft_ratio": self.turn_ttft_ratio,
        }

    @property
    def server_ratio(self) -> float | None:
        """Clients' tokens / the server's count: 1.0 when every generated token arrived."""
        if not self.server_output_tokens:
            return None
        return self.num_output_tokens / self.server_output_tokens

    def get(self, metric: str, pct: str) -> float | None:
        return self.latency.get(metric, {}).get(pct)


def summarize(stage: StageResult, slo: SLO, level: float | None = None) -> LevelSummary:
    """Summarize a stage (or, for a ramp, its requests sent at `level`)."""
    rs = [r for r in stage.results if level is None or r.level == level]
    ok = [r for r in rs if r.ok]
    if level is not None and rs:  # a ramp step: its own span of wall time
        wall = max(r.start + (r.e2e_s or 0.0) for r in rs) - min(r.start for r in rs)
    else:
        wall = stage.wall_s
    wall = max(wall, 1e-9)
    latency = {}
    for metric in METRICS:
        if metric == "itl_s":
            values = [x for r in ok for x in r.itl_s]
        else:
            values = [v for r in ok if (v := getattr(r, metric)) is not None]
        stats = {f"p{q}": percentile(values, q) for q in (50, 90, 95, 99)}
        stats["mean"] = sum(values) / len(values) if values else None
        latency[metric] = stats
    num_good = sum(slo.met_by(r) for r in rs)
    num_out = sum(r.num_output_tokens for r in ok)
    num_prompt = sum(r.num_prompt_tokens or 0 for r in ok)
    return LevelSummary(
        level=stage.stage.level if level is None else level,
        mode=stage.stage.mode,
        num_requests=len(rs),
        num_ok=len(ok),
        errors=dict(Counter(r.error for r in rs if not r.ok)),
        wall_s=wall,
        request_throughput=len(ok) / wall,
        output_token_throughput=num_out / wall,
        input_token_throughput=num_prompt / wall,
        goodput=num_good / wall,
        goodput_frac=num_good / len(rs) if rs else 0.0,
        latency=latency,
        num_output_tokens=num_out,
        server_output_tokens=stage.server_output_tokens if level is None else None,
        num_prompt_tokens=num_prompt,
        num_cached_tokens=sum(r.num_cached_tokens for r in ok),
        turns=summarize_turns(rs),
    )


def summarize_all(stages: list[StageResult], slo: SLO) -> list[LevelSummary]:
    out = []
    for stage in stages:
        if stage.stage.mode == "ramp":
            levels = sorted({r.level for r in stage.results})
            out.extend(summarize(stage, slo, level) for level in levels)
        else:
            out.append(summarize(stage, slo))
    return out


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


def turn_ratio_line(s: LevelSummary) -> str | None:
    """'turn 8 / turn 1 TTFT: p50 1.23x, p90 1.41x' (None: not multi-turn)."""
    ratio = s.turn_ttft_ratio
    if ratio is None:
        return None
    parts = [f"{p} {'n/a' if ratio[p] is None else f'{ratio[p]:.2f}x'}" for p in ("p50", "p90")]
    return f"turn {ratio['last_turn']} / turn {ratio['first_turn']} TTFT: " + ", ".join(parts)


def write_json(
    path: Path,
    config: dict,
    summaries: list[LevelSummary],
    stages: list[StageResult],
    samples: list[StatsSample],
) -> None:
    """The whole run: its settings, the summaries, every request (without a conversation's
    answer text) and every stats sample."""
    doc = {
        "config": config,
        "summaries": [s.to_json() for s in summaries],
        "requests": [
            {**dataclasses.asdict(r, dict_factory=_without_answer), "tpot_s": r.tpot_s}
            for st in stages
            for r in st.results
        ],
        "stats_samples": [dataclasses.asdict(s) for s in samples],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))


def _without_answer(pairs: list[tuple]) -> dict:
    return {k: v for k, v in pairs if k != "answer"}
