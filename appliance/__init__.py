"""The product around the engine: the `appliance` command (serve, top, profile, bench, tune,
eval-quant), its settings, the OpenAI-compatible HTTP server (server/: routes, keys and limits,
tool calls, structured outputs, stats and metrics) and the load generator behind bench and
tune."""
