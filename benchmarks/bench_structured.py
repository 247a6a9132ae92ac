"""What structured outputs cost on one engine, in one run: requests under a JSON schema against
the same requests without one, at batch 1 (TPOT) and at --concurrency (output throughput); the
compile time of a 50-property schema, first and cached; the host's mask time per step from the
constrained requests' traces.

    PYTHONPATH=. python scripts/bench_structured.py --out DIR            # Llama-3-8B shape, GPU
    PYTHONPATH=. python scripts/bench_structured.py --smoke --out DIR    # tiny layers, CPU

The engine: random weights in a preset's shape (--model, default llama-3-8b) with the embedded
SmolLM2 tokenizer, every setting planned, as `appliance serve --model llama-3-8b --load-format
random` builds it; the preset's vocabulary is cut to the tokenizer's 49,152 tokens
(appliance/model_presets.py). --smoke keeps that tokenizer and vocabulary, shrinks every layer
(benchmarks/presets.py TINY_DIMS) and runs tiny sizes on the CPU.

Both arms: greedy, ignore_eos, --max-tokens tokens, prompts of --prompt-len fresh random token
ids (no two requests share a prefix). The schema arm asks for an array of at least 1,000 bounded
records (benchmarks/structured_schemas.py), so no output completes it before max_tokens and
both arms produce equal lengths; every constrained output is checked against a hand-written
regular expression of the schema's JSON (an instance or the beginning of one). Drift: after one
warm-up request and one warm-up wave per arm (which also compile the schema once), the arms run
in rounds of A B B A (unconstrained, schema, schema, unconstrained): --rounds rounds of one
request per turn at batch 1, then --rounds rounds of one wave of --concurrency requests per turn
(all added at once, run to the end). TPOT per request is (last token - first token) / (tokens -
1), median per arm; an arm's throughput is its output tokens / its waves' wall time. Loss: schema
TPOT / unconstrained - 1, and 1 - schema tok/s / unconstrained tok/s; goals <= 3% and <= 5%. The
floor (benchmarks/floor.py, device rates measured first in the same run) stands beside the
unconstrained figures. Results: DIR/bench_structured.json; the markdown table for
docs/performance.md is printed last. Exit status 1 when an output breaks its schema or stops
short of max_tokens.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from appliance import model_presets
from appliance.server.request_grammar import special_literal
from appliance.server.tools import PARSERS
from benchmarks.floor import (
    ModelShape,
    batch1_decode_floor_tok_s,
    measure_hardware,
    throughput_floor,
)
from benchmarks.presets import TINY_DIMS, random_prompts
from benchmarks.structured_report import (
    ARMS,
    compile_times,
    markdown,
    summarise,
)
from benchmarks.structured_schemas import PATTERNS, RECORDS_SCHEMA, WRITE_FILES, is_valid_prefix
from engine import LLM, SamplingParams
from engine.structured import StructuredOutput

ROUND = (ARMS[0], ARMS[1], ARMS[1], ARMS[0])
"""One round, A B B A: a drift linear in time weighs on both arms alike."""
WARMUP_TOKENS = 16
DEFAULTS = {
    "full": dict(prompt_len=128, max_tokens=256, concurrency=64, rounds=4, compile_repeats=5),
    "smoke": dict(prompt_len=8, max_tokens=12, concurrency=3, rounds=1, compile_repeats=2),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/bench_structured"), help="folder")
    ap.add_argument("--model", default="llama-3-8b", help="preset name (random weights)")
    ap.add_argument("--smoke", action="store_true", help="tiny layers, tiny sizes, on the CPU")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    ap.add_argument("--dtype", default=None, help="default: the engine's choice")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per request")
    ap.add_argument("--max-tokens", type=int, default=None, help="output tokens per request")
    ap.add_argument("--concurrency", type=int, default=None, help="requests per wave")
    ap.add_argument("--rounds", type=int, default=None, help="A B B A rounds per phase")
    ap.add_argument("--compile-repeats", type=int, default=None, help="fresh backends timed")
    ap.add_argument(
        "--schema",
        choices=sorted(PATTERNS),
        default="records",
        help="the constrained arm's constraint: the record-array JSON schema (bounded strings) "
        "or a forced call of an agent's tool (free-length strings, Hermes markup)",
    )
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    for key, value in DEFAULTS["smoke" if args.smoke else "full"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    counts = ("prompt_len", "max_tokens", "concurrency", "rounds", "compile_repeats")
    if min(getattr(args, k) for k in counts) < 1 or args.max_tokens < 2:
        ap.error(
            "--prompt-len, --concurrency, --rounds, --compile-repeats must be >= 1 and "
            "--max-tokens >= 2 (TPOT needs two tokens)"
        )
    if model_presets.preset_path(args.model) is None:
        ap.error(f"--model must be a preset: {', '.join(model_presets.preset_names())}")
    return args


# --- the engine ----------------------------------------------------------------------------------
def model_folder(args, parent: Path) -> Path:
    """The preset's servable folder (config and the embedded tokenizer); with --smoke a copy
    whose layers have TINY_DIMS (the vocabulary stays the tokenizer's)."""
    folder = model_presets.preset_folder(args.model)
    if not args.smoke:
        return folder
    tiny = parent / f"{args.model}-tiny"
    shutil.copytree(folder, tiny)
    config = json.loads((folder / "config.json").read_text())
    config.update({k: v for k, v in TINY_DIMS.items() if k != "vocab_size"})
    (tiny / "config.json").write_text(json.dumps(config, indent=1))
    return tiny


def build_engine(args, folder: Path):
    settings = dict(device=args.device, load_format="random", seed=0)
    engine = LLM(folder, **settings, **({"dtype": args.dtype} if args.dtype else {})).engine
    if engine.config.max_num_seqs < args.concurrency:
        raise SystemExit(
            f"the engine runs at most {engine.config.max_num_seqs} sequences at once: lower "
            f"--concurrency to that, or the waves would queue"
        )
    return engine


def constraint(schema: str, tokenizer) -> StructuredOutput:
    """The constrained arm's StructuredOutput: --schema's, as the server would build it."""
    if schema == "records":
        return StructuredOutput.json_schema(RECORDS_SCHEMA)
    grammar = PARSERS["hermes"]().forced_grammar([WRITE_FILES], False, special_literal(tokenizer))
    return StructuredOutput("grammar", grammar)


# --- running the arms ----------------------------------------------------------------------------
class Runner:
    """Adds waves of requests to the engine and steps it until they finish."""

    def __init__(self, engine, args) -> None:
        self.engine, self.args = engine, args
        self.spec = constraint(args.schema, engine.tokenizer)
        self._ids = itertools.count()
        self._seeds = itertools.count(1)

    def params(self, arm: str, max_tokens: int) -> SamplingParams:
        structured = self.spec if arm == "json_schema" else None
        return SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, structured=structured
        )

    def wave(self, arm: str, num_requests: int, max_tokens: int) -> dict:
        """num_requests requests added at once (fresh prompts), stepped to the end."""
        vocab = self.engine.model_config.vocab_size
        n = self.args.prompt_len
        prompts = random_prompts(num_requests, n, n, vocab, seed=next(self._seeds))
        params = self.params(arm, max_tokens)
        ids = [f"{arm}-{next(self._ids)}" for _ in prompts]
        start = time.perf_counter()
        for request_id, prompt in zip(ids, prompts, strict=True):
            self.engine.add_request(request_id, prompt, params)
        done = {}
        while len(done) < len(ids):
            if not self.engine.has_unfinished():
                raise RuntimeError(f"the engine went idle with {len(ids) - len(done)} unfinished")
            done.update((o.request_id, o) for o in self.engine.step() if o.finished)
        return {
            "arm": arm,
            "wall_s": time.perf_counter() - start,
            "outputs": [done[i] for i in ids],
        }

    def rounds(self, batch: int) -> list[dict]:
        """One warm-up wave per arm, then --rounds rounds of ROUND, one wave per turn."""
        for arm in ARMS:
            self.wave(arm, batch, WARMUP_TOKENS)
        return [
            self.wave(arm, batch, self.args.max_tokens)
            for _ in range(self.args.rounds)
            for arm in ROUND
        ]


def check_outputs(waves: list[dict], max_tokens: int, tokenizer, schema: str) -> list[str]:
    """What is wrong with the measured outputs: any that stopped short of max_tokens (the arms
    would not compare) or whose text is not a valid beginning of the schema's JSON."""
    problems = []
    for w in waves:
        for out in w["outputs"]:
            if len(out.token_ids) != max_tokens:
                problems.append(
                    f"{out.request_id} ended after {len(out.token_ids)} of {max_tokens} tokens "
                    f"({out.finish_reason}, {out.stop_reason})"
                )
            elif w["arm"] == "json_schema":
                text = tokenizer.decode(out.token_ids)
                if not is_valid_prefix(text, schema):
                    problems.append(f"{out.request_id} broke the schema: {text[:200]!r}")
    return problems


def progress(label: str, waves: list[dict]) -> None:
    """One line per phase as it ends: each arm's output tok/s over its waves."""
    rates = []
    for arm in ARMS:
        mine = [w for w in waves if w["arm"] == arm]
        tokens = sum(len(o.token_ids) for w in mine for o in w["outputs"])
        rates.append(f"{arm} {tokens / sum(w['wall_s'] for w in mine):,.1f} out tok/s")
    print(f"{label}: {', '.join(rates)}", flush=True)


# --- the floor -----------------------------------------------------------------------------------
def floors(args, hw, engine) -> dict:
    """The unconstrained arms' floors: batch-1 TPOT and a wave's output tok/s."""
    shape = ModelShape.from_model_config(
        engine.model_config, engine.dtype.itemsize, engine.kv_dtype.itemsize
    )
    n, c, m = args.prompt_len, args.concurrency, args.max_tokens
    wave = throughput_floor(shape, hw, [n] * c, [m] * c)
    return {
        "bandwidth": hw.bandwidth,
        "matmul_flops": hw.matmul_flops,
        "batch1_tpot_s": 1 / batch1_decode_floor_tok_s(shape, hw, n, m),
        "wave_out_tok_s": wave.tok_s,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16
    hw = measure_hardware(device, dtype if device.type == "cuda" else torch.float32)
    with tempfile.TemporaryDirectory(prefix="bench-structured-") as tmp:
        start = time.perf_counter()
        engine = build_engine(args, model_folder(args, Path(tmp)))
        build_s = time.perf_counter() - start
        if engine.tokenizer is None:
            raise SystemExit(f"{engine.folder} has no tokenizer: structured outputs need one")
        print(f"engine built in {build_s:.1f} s: {engine.config}", flush=True)
        runner = Runner(engine, args)
        batch1 = runner.rounds(1)
        progress("batch 1", batch1)
        concurrent = runner.rounds(args.concurrency)
        progress(f"{args.concurrency} concurrent", concurrent)
        compiled = compile_times(engine, args.compile_repeats)
        engine_after = {**engine.stats(), "compiles_after_warmup": engine.compiles_after_warmup()}
    problems = check_outputs(batch1 + concurrent, args.max_tokens, engine.tokenizer, args.schema)
    results = {
        "started": started,
        "argv": sys.argv[1:] if argv is None else argv,
        "model": args.model + (" (tiny layers)" if args.smoke else ""),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "engine_build_s": build_s,
        "config": {k: str(v) for k, v in vars(engine.config).items()},
        "engine_after": engine_after,  # kernels built while measuring: want none
        "workload": {
            "prompt_tokens": args.prompt_len,
            "output_tokens": args.max_tokens,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "order": "warm-up wave per arm, then rounds of " + " ".join(ROUND),
            "schema": args.schema,
            "constraint": runner.spec.value,
        },
        "floor": floors(args, hw, engine),
        **summarise(batch1, concurrent, args.concurrency),
        "compile": compiled,
        "problems": problems,
    }
    (args.out / "bench_structured.json").write_text(json.dumps(results, indent=1, default=str))
    print(markdown(results))
    for problem in problems:
        print("PROBLEM:", problem)
    print(f"results: {args.out / 'bench_structured.json'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
