"""Bench figures: SLO parsing, per-level summaries (percentiles, throughput, goodput, error
counts, prompt tokens served from the prefix cache), per-turn figures of multi-turn runs and
the JSON document (appliance/loadgen/tables.py prints them)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from appliance.loadgen.client import RequestResult
from appliance.loadgen.load_shapes import StageResult, StatsSample

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
    server_cache_queries: int | None = None
    """Prompt tokens the server's counter says it looked up in its prefix cache over the stage
    (None: not reported, or a ramp step)."""
    server_cached_tokens: int | None = None
    """Of those, the ones its counter says it found cached."""

    @property
    def cached_tokens_mean(self) -> float | None:
        """Cached prompt tokens per successful request."""
        return self.num_cached_tokens / self.num_ok if self.num_ok else None

    @property
    def cache_hit_share(self) -> float | None:
        """Cached / prompt tokens of the successful requests."""
        return _share(self.num_cached_tokens, self.num_prompt_tokens)

    @property
    def server_cache_hit_share(self) -> float | None:
        """The server counters' cached / looked-up prompt tokens."""
        if self.server_cached_tokens is None or self.server_cache_queries is None:
            return None
        return _share(self.server_cached_tokens, self.server_cache_queries)

    @property
    def turn_ttft_ratio(self) -> dict | None:
        """The last turn's TTFT over the first turn's, at p50 and p90 (None: fewer than two
        turns; a ratio is None when either turn has no TTFT)."""
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
            "server_cache_hit_share": self.server_cache_hit_share,
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
        server_cache_queries=stage.server_cache_queries if level is None else None,
        server_cached_tokens=stage.server_cached_tokens if level is None else None,
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
