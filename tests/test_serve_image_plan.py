"""`appliance serve`'s image limits reach the plan: the engine loader hands them to the engine,
and the engine's plan sizes the vision encoder's share with them."""

from __future__ import annotations

from appliance.serve_plan import EngineLoader
from appliance.settings import load_settings
from engine.startup.model_setup import set_up_model
from engine.startup.phases import StartupTimer
from tests.support.tiny_vision import tiny_qwen3_5_vision


def test_the_loader_passes_the_image_limits(monkeypatch, tmp_path):
    import engine.llm_engine

    seen = {}
    monkeypatch.setattr(engine.llm_engine, "LLMEngine", lambda *a, **kw: seen.update(kw))
    settings = load_settings(
        {"model": str(tmp_path), "max_image_pixels": 1000, "max_images_per_request": 2}, env={}
    )
    EngineLoader(settings)()
    assert seen["plan_targets"] == {"max_image_pixels": 1000, "max_images_per_request": 2}


def test_the_engine_plan_reads_them(tmp_path):
    tiny_qwen3_5_vision(tmp_path)

    def planned(**targets):
        setup = set_up_model(tmp_path, "cpu", None, {}, StartupTimer(None), targets)
        return setup.plan

    small, large = planned(max_image_pixels=4096), planned(max_image_pixels=65536)
    assert large.vision_activation_bytes > small.vision_activation_bytes > 0
    assert planned().vision_activation_bytes > large.vision_activation_bytes  # 4096 x 4096
