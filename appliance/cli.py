"""The `appliance` command: serve, top, profile, bench, tune, soak and eval-quant."""

from __future__ import annotations

import argparse
import sys

from appliance.bench_cmd import add_bench_parser, run_bench
from appliance.eval_quant_cmd import add_eval_quant_parser, run_eval_quant
from appliance.profile_cmd import add_profile_parser, run_profile
from appliance.settings import SettingsError, add_serve_flags, load_settings
from appliance.soak.cmd import add_soak_parser, run_soak
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
    add_serve_flags(p)


def _top_parser(sub) -> None:
    p = sub.add_parser(
        "top",
        help="the terminal dashboard of a running appliance",
        description="Attach the terminal dashboard to a running appliance, local or on the LAN. "
        "It reconnects by itself when the server restarts.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the appliance's base URL")
    p.add_argument(
        "--api-key", help="API key, when the server asks for one (default: $APPLIANCE_TOP_API_KEY)"
    )
    p.add_argument(
        "--no-verify-tls",
        dest="verify_tls",
        action="store_false",
        help="accept a self-signed HTTPS certificate",
    )
    p.add_argument(
        "--web",
        action="store_true",
        help="serve this dashboard to a browser (textual-serve) instead of showing it here",
    )
    p.add_argument("--web-host", default="127.0.0.1", help="with --web, the address to bind")
    p.add_argument("--web-port", type=int, default=8001, help="with --web, the port to bind")


def run_top(args: argparse.Namespace) -> int:
    import os

    from tui.browser import API_KEY_ENV, is_web_driven, serve_in_browser

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.web:
        serve_in_browser(args.url, api_key, args.verify_tls, args.web_host, args.web_port)
        return 0
    if not is_web_driven() and not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("appliance top: needs a terminal (stdin and stdout are not a TTY)", file=sys.stderr)
        return 2
    from tui import create_app

    create_app(args.url, api_key, verify_tls=args.verify_tls).run()
    return 0


COMMANDS = {
    "top": run_top,
    "profile": run_profile,
    "bench": run_bench,
    "tune": run_tune,
    "soak": run_soak,
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
    add_soak_parser(sub)
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
