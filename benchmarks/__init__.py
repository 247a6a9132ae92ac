"""Benchmarks and profiling tools of the appliance, run from the source tree: the shared parts
(floor: device rates and the floor; presets: random-weight engines in real shapes and seeded
workloads), the workloads the README and docs/performance.md cite (`python -m benchmarks.NAME`,
or scripts/NAME.py for those the README names) and the kernel benchmarks in benchmarks.kernels."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The source tree: where subprocesses of `appliance` run from and profiles/ lives."""
