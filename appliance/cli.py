"""The `appliance` command: serve, top, profile, bench, tune and eval-quant."""

from __future__ import annotations

import argparse
import sys

from appliance.bench_cmd import add_bench_parser, run_bench
from appliance.eval_quant_cmd import add_eval_quant_parser, run_eval_quant
from appliance.profile_cmd import add_profile_parser, run_profile
from appliance.settings import SettingsError, load_settings
from appliance.tune_cmd import add_tune_parser, run_tune


def _serve_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API. Every flag can also be "
        "set in a TOML file (--config) or as APPLIANCE_<NAME> in the environment; flags win, "
        "then the environment, then the file.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", metavar="TOML", help="settings file (keys are the flag names)")
    p.add_argument("--model", help="HF model folder or .gguf file (default: embedded SmolLM2)")
    p.add_argument("--served-model-name", help="model name clients use (default: the model's)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000; 0 = any free port)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"])
    p.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--max-model-len", type=int, help="longest prompt + output in tokens")
    p.add_argument("--max-num-seqs", type=int, help="most sequences running at once")
    p.add_argument("--max-num-batched-tokens", type=int, help="token budget of one engine step")
    p.add_argument("--block-size", type=int, help="tokens per KV-cache block")
    p.add_argument("--num-kv-blocks", type=int, help="KV-cache blocks (default: planned)")
    p.add_argument("--gpu-memory-utilization", type=float, help="share of GPU memory to use")
    p.add_argument("--kv-cache-dtype", help="KV-cache element type")
    p.add_argument("--quantization", choices=["none", "int8", "int4", "auto"])
    p.add_argument("--quant-block-size", type=int, help="int4: weights per absmax group (64)")
    p.add_argument("--quantize-embeddings", action="store_true", default=None,
                   help="with int8/int4: quantize the LM head and embeddings too")  # fmt: skip
    p.add_argument("--enforce-eager", action="store_true", help="disable CUDA graphs")
    p.add_argument("--seed", type=int, help="engine seed for requests without one")
    p.add_argument("--adaptive-batching", action="store_true",
                   help="scale each step's token budget with the waiting queue")  # fmt: skip
    p.add_argument(
        "--load-format",
        choices=["auto", "random"],
        help="random: random weights (--model may then be a preset, e.g. llama-3-8b)",
    )
    p.add_argument("--profile", metavar="NAME",
                   help="a tuned profile from `appliance tune` (name or .toml path)")  # fmt: skip
    p.add_argument("--max-queue", type=int, help="most waiting requests before 429 (default 128)")
    p.add_argument("--max-n", type=int, help="most choices one request may ask for (default 16)")
    p.add_argument("--api-key", action="append", metavar="[NAME:]KEY",
                   help="accept this key (repeatable)")  # fmt: skip
    p.add_argument("--api-key-file", metavar="FILE", help="keys, one per line: KEY or NAME KEY")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="allow a non-loopback bind without API keys")  # fmt: skip
    p.add_argument("--drain-timeout", type=float, help="seconds to drain on SIGTERM (default 30)")
    p.add_argument("--request-timeout", type=float, help="total seconds per request (0 = none)")
    p.add_argument("--ttft-timeout", type=float, help="seconds to the first token (0 = none)")
    p.add_argument("--stall-timeout", type=float, help="seconds between tokens (0 = none)")
    p.add_argument("--log-requests", metavar="PATH", help="append a JSON line per request")
    p.add_argument("--ssl-certfile", metavar="PEM", help="TLS certificate")
    p.add_argument("--ssl-keyfile", metavar="PEM", help="TLS private key")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="allow this browser origin (repeatable; '*' for any)")  # fmt: skip
    p.add_argument("--max-body-bytes", type=int, help="largest request body (default 4 MiB)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--tui", action="store_true",
                   help="show the dashboard in this terminal (logs go to --log-file)")  # fmt: skip
    p.add_argument("--log-file", metavar="PATH",
                   help="with --tui, the server log file (default: "
                   "$XDG_STATE_HOME/llm-appliance/serve.log)")  # fmt: skip


def _top_parser(sub) -> None:
    p = sub.add_parser(
        "top",
        help="the terminal dashboard of a running appliance",
        description="Attach the terminal dashboard to a running appliance, local or on the LAN. "
        "It reconnects by itself when the server restarts.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the appliance's base URL")
    p.add_argument("--api-key", help="API key, when the server asks for one "
                   "(default: $APPLIANCE_TOP_API_KEY)")  # fmt: skip
    p.add_argument("--no-verify-tls", dest="verify_tls", action="store_false",
                   help="accept a self-signed HTTPS certificate")  # fmt: skip


def run_top(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("appliance top: needs a terminal (stdin and stdout are not a TTY)", file=sys.stderr)
        return 2
    import os

    from tui import create_app

    api_key = args.api_key or os.environ.get("APPLIANCE_TOP_API_KEY") or None
    create_app(args.url, api_key, verify_tls=args.verify_tls).run()
    return 0


COMMANDS = {
    "top": run_top,
    "profile": run_profile,
    "bench": run_bench,
    "tune": run_tune,
    "eval-quant": run_eval_quant,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance",
        description="A single-GPU LLM serving appliance: paged-KV continuous batching behind an "
        "OpenAI-compatible API.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_parser(sub)
    _top_parser(sub)
    add_profile_parser(sub)
    add_bench_parser(sub)
    add_tune_parser(sub)
    add_eval_quant_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command in COMMANDS:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return COMMANDS[args.command](args)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    flags = {k: v for k, v in vars(args).items() if k != "command"}
    try:
        settings = load_settings(flags)
    except SettingsError as exc:
        print(f"appliance serve: {exc}", file=sys.stderr)
        return 2
    from appliance.serve import run_server

    return run_server(settings)


if __name__ == "__main__":
    sys.exit(main())
