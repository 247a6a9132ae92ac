"""The product around the engine: CLI, settings, HTTP server (and, later, planner and tools)."""
