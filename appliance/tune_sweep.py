"""Engine-setting sweeps for `appliance tune --serve`: the grid of points (`--sweep NAME=A,B`),
one `appliance serve` subprocess per point, and the choice of the best point."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from appliance.settings import ENV_PREFIX, TUNABLE, SettingsError, load_settings
from appliance.tune import SearchResult


@dataclass
class PointResult:
    """One sweep point's search."""

    point: dict
    """setting -> typed value (as the server parsed it)."""
    result: SearchResult
    info: object | None = None
    """The server's ServerInfo at this point."""

    @property
    def label(self) -> str:
        return point_label(self.point)

    def score(self) -> tuple:
        """Capacity first (the highest concurrency meeting the SLOs), then the goodput and the
        token throughput measured there."""
        best = self.result.best_probe
        if best is None:
            return (0, 0.0, 0.0)
        s = best.summary
        return (self.result.best, s.goodput, s.output_token_throughput)


def point_label(point: dict) -> str:
    def show(v) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    return " ".join(f"{k}={show(v)}" for k, v in point.items()) or "as configured"


def parse_sweep(specs: list[str]) -> list[dict]:
    """`["max_num_seqs=32,64", "adaptive_batching=off,on"]` -> every combination, each a dict
    of typed values (validated the way `appliance serve` reads APPLIANCE_* variables)."""
    axes: dict[str, list] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ValueError(f"--sweep {spec!r}: expected NAME=VALUE,VALUE,...")
        if name not in TUNABLE:
            raise ValueError(f"--sweep {name!r}: sweepable settings are {', '.join(TUNABLE)}")
        if name in axes:
            raise ValueError(f"--sweep {name!r} given twice")
        typed = []
        for raw in (v.strip() for v in values.split(",") if v.strip()):
            try:
                settings = load_settings({}, env={ENV_PREFIX + name.upper(): raw})
            except SettingsError as exc:
                raise ValueError(f"--sweep {name}: {exc}") from None
            typed.append(getattr(settings, name))
        axes[name] = typed
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def point_env(point: dict) -> dict[str, str]:
    """The APPLIANCE_* variables that give a server this point's settings."""

    def text(v) -> str:
        return ("1" if v else "0") if isinstance(v, bool) else str(v)

    return {ENV_PREFIX + k.upper(): text(v) for k, v in point.items()}


def pick_best(rows: list[PointResult]) -> PointResult | None:
    """The point with the highest capacity meeting the SLOs (the earliest on a tie)."""
    good = [r for r in rows if r.result.best is not None]
    return max(good, key=PointResult.score) if good else None


def sweep_table(rows: list[PointResult], winner: PointResult | None, pct: str) -> Table:
    table = Table(title="appliance tune: sweep points")
    for col in (
        "point",
        "best concurrency",
        "first bad",
        "out tok/s",
        "goodput req/s",
        f"{pct} TTFT ms",
        f"{pct} TPOT ms",
        "",
    ):
        table.add_column(col, justify="left" if col == "point" else "right")
    for r in rows:
        p = r.result.best_probe
        s = p.summary if p else None

        def ms(metric: str, s=s) -> str:
            v = s.get(metric, pct) if s else None
            return "n/a" if v is None else f"{v * 1000:.1f}"

        table.add_row(
            r.label,
            str(r.result.best or "none"),
            str(r.result.first_bad or "-"),
            f"{s.output_token_throughput:.1f}" if s else "n/a",
            f"{s.goodput:.2f}" if s else "n/a",
            ms("ttft_s"),
            ms("tpot_s"),
            "[green]best" if r is winner else "",
        )
    return table


@contextlib.asynccontextmanager
async def serve_process(
    model: str | None,
    serve_args: list[str],
    point: dict,
    log_path: Path,
    startup_timeout_s: float = 900.0,
) -> AsyncIterator[str]:
    """`appliance serve` on a free local port with the point's settings; yields its base URL
    once it prints the serving line, and drains and stops it (SIGTERM) afterwards."""
    cmd = [sys.executable, "-m", "appliance", "serve", "--host", "127.0.0.1", "--port", "0"]
    cmd += (["--model", model] if model and model != "embedded" else []) + serve_args
    env = {**os.environ, **point_env(point), "PYTHONUNBUFFERED": "1"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=log, env=env, start_new_session=True
        )
        drain: asyncio.Task | None = None
        try:
            url = await asyncio.wait_for(_serving_url(proc, log), startup_timeout_s)
            if url is None:
                raise RuntimeError(
                    f"appliance serve ({point_label(point)}) exited with "
                    f"{proc.returncode}; its log: {log_path}"
                )
            drain = asyncio.create_task(_copy(proc.stdout, log))
            yield url
        except TimeoutError:
            raise RuntimeError(
                f"appliance serve did not start in {startup_timeout_s:g}s; its log: {log_path}"
            ) from None
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 60)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            if drain is not None:
                drain.cancel()


async def _serving_url(proc, log) -> str | None:
    while line := await proc.stdout.readline():
        log.write(line)
        log.flush()
        match = re.search(r"at (https?://\S+)/v1", line.decode(errors="replace"))
        if match:
            return match.group(1)
    await proc.wait()
    return None


async def _copy(stream, log) -> None:
    while line := await stream.readline():
        log.write(line)
        log.flush()
