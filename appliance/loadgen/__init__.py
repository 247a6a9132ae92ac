"""Load generation for `appliance bench` and `appliance tune`: workloads, load shapes, the
streaming client, the /v1/stats sampler, reports and plots."""

from __future__ import annotations

from appliance.loadgen.client import ClientConfig, RequestResult
from appliance.loadgen.load_shapes import Stage, StageResult, StatsSample
from appliance.loadgen.report import SLO, LevelSummary, summarize, summarize_all
from appliance.loadgen.session import LoadSession, ServerInfo
from appliance.loadgen.workload import LengthDist, WorkItem, WorkloadSpec

__all__ = [
    "SLO",
    "ClientConfig",
    "LengthDist",
    "LevelSummary",
    "LoadSession",
    "RequestResult",
    "ServerInfo",
    "Stage",
    "StageResult",
    "StatsSample",
    "WorkItem",
    "WorkloadSpec",
    "summarize",
    "summarize_all",
]
