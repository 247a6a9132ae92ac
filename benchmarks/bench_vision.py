"""Images on the engine: time to first token of one image request against its compute floor,
and throughput of concurrent image requests beside text requests already decoding (their
time per output token with and without the images), on random weights in real shapes.

On a GPU (one H100, bf16: Gemma 3 12B ~24 GB, Qwen3.5-27B ~54 GB of weights; max_model_len
4096 keeps the KV pool small):

    python -m benchmarks.bench_vision --model gemma3-12b --device cuda --dtype bfloat16 \
        --concurrency 32 --out results/
    python -m benchmarks.bench_vision --model qwen3.5-27b --device cuda --dtype bfloat16 \
        --skip-throughput --out results/

The shapes (benchmarks/bench_vision_shapes.py says where each value comes from): Gemma 3 12B
with SigLIP so400m at 896 px (one 896 x 896 image: 4096 patches, 256 placeholders) and
Qwen3.5-27B with its Qwen3-VL-style tower (one 1280 x 720 screenshot, resized as the Qwen2-VL
processor's smart_resize does to 1280 x 704: 44 x 80 patches, 880 placeholders); each image
is followed by a 50-token question. The engine draws its own random weights from config.json
(load_format="random"); prompts are token ids.

1. TTFT: one request at a time (first_token_time - arrival_time of its metrics), each with an
   image and question not seen before (no encoder-cache or prefix-cache hit), after a warm-up
   request. Floor: the encoder's FLOPs over its GEMM rate plus the prompt's prefill FLOPs over
   the text model's, both rates measured in the same run by benchmarks.embed_floor's
   prefill_matmul_rate at each part's own shape ([patches x vision hidden] x [vision hidden x
   vision MLP], [prompt tokens x hidden] x [hidden x MLP]). Goal for Gemma 3: TTFT <= 1.3 x floor.
2. Throughput (skipped with --skip-throughput, as for Qwen3.5-27B above, which then keeps
   only 4 sequence slots): `--concurrency` image requests (--output-tokens, 64, each) arrive
   together while 4 text-only requests are decoding; the engine's encoder budget
   (max_encoder_tokens) is its default. Reports image requests/s, output tokens/s, the image
   requests' TTFT, and the text requests' time between tokens (TPOT, timed at each step's
   return) while the images encode and prefill and until the last image request ends,
   against the same before the images arrived.

--tiny runs the same code with small layers on the CPU in seconds:

    python -m benchmarks.bench_vision --model gemma3-12b --tiny [--device cpu]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from benchmarks import bench_vision_shapes as shapes
from benchmarks.embed_floor import prefill_matmul_rate
from benchmarks.floor import prefill_flops
from benchmarks.op_profile import top_ops
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

GOAL = 1.3
"""Gemma 3's TTFT may take at most this multiple of its floor."""
QUESTION_TOKENS = 50
NUM_TEXT = 4
"""Text-only requests decoding beside the image requests."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TTFTResult:
    """What part 1 measured: lone image requests' TTFT and their floor's terms."""

    ttft_s: list[float]
    """Each measured request's first_token_time - arrival_time."""
    encoder_ms: list[float]
    """The encoder's milliseconds in each (the request's images_encoded trace event)."""
    prompt_tokens: int
    num_patches: int
    encoder_flops: float
    text_flops: float
    vision_rate: float
    """FLOP/s of the encoder's GEMM shape."""
    text_rate: float
    """FLOP/s of the prompt's prefill GEMM shape."""

    @property
    def floor_s(self) -> float:
        return self.encoder_flops / self.vision_rate + self.text_flops / self.text_rate


@dataclass
class MixedResult:
    """What part 2 measured: image requests arriving together beside decoding text requests."""

    num_images: int
    output_tokens: int
    """Each image request's."""
    images_s: float
    """From the image requests' arrival to the last one's finish."""
    image_output_tokens: int
    text_output_tokens: int
    """Text requests' tokens in that window."""
    tpot_alone_s: list[float] = field(default_factory=list)
    """The text requests' times between tokens before the images arrive."""
    tpot_prefill_s: list[float] = field(default_factory=list)
    """The same from the images' arrival until every image request has its first token (their
    encoding and prefill)."""
    tpot_decode_s: list[float] = field(default_factory=list)
    """The same from then until the last image request finishes."""
    image_ttft_s: list[float] = field(default_factory=list)
    """Each image request's first_token_time - arrival_time."""

    @property
    def tpot_with_images_s(self) -> list[float]:
        return self.tpot_prefill_s + self.tpot_decode_s


class Bench:
    """One engine of a shape, and the prompts the benchmark sends it."""

    def __init__(self, model: str, tiny: bool, engine: LLMEngine) -> None:
        self.model, self.engine = model, engine
        self.config = shapes.checkpoint_config(model, tiny)
        spec = shapes.MODELS[model]
        self.width, self.height = spec.tiny_image if tiny else spec.image
        self.image = shapes.image_shape(self.config, self.width, self.height)
        self.ids = iter(range(10**9))
        self.seeds = iter(range(1000, 10**9))

    def prompt(self, question_tokens: int = QUESTION_TOKENS):
        """An image prompt of its own: its image and question drawn from a seed never used
        before (no encoder-cache or prefix-cache hit)."""
        seed = next(self.seeds)
        data = shapes.random_image(self.config, self.width, self.height, seed)
        question = shapes.random_text(self.config, question_tokens, seed)
        return shapes.image_prompt(self.config, self.model, data, question, self.image.num_tokens)

    def add(self, ids: list[int], params: SamplingParams, images=None) -> str:
        request_id = f"bench-{next(self.ids)}"
        self.engine.add_request(request_id, ids, params, images=images)
        return request_id


def run_ttft(bench: Bench, repeats: int, warmups: int) -> tuple[list[float], list[float], int]:
    """(TTFT seconds, encoder ms, prompt tokens) of `repeats` lone requests after `warmups`."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ttfts, encoder_ms, n_tokens = [], [], 0
    for i in range(warmups + repeats):
        ids, images = bench.prompt()
        rid = bench.add(ids, params, images)
        final = None
        while final is None or bench.engine.has_unfinished():
            for out in bench.engine.step():
                final = out if out.request_id == rid and out.finished else final
        if i < warmups:
            continue
        if final.num_cached_tokens:
            raise RuntimeError(f"request {rid} hit the prefix cache: TTFT would be understated")
        m = final.metrics
        ttfts.append(m.first_token_time - m.arrival_time)
        encoder_ms.append(sum(e.detail["ms"] for e in final.trace if e.event == "images_encoded"))
        n_tokens = len(ids)
    return ttfts, encoder_ms, n_tokens


def _track(outputs, text_ids: set[str], last: dict, gaps: list[float], now: float) -> int:
    """Record the text requests' times between tokens (a step reporting k tokens of one request
    counts k gaps of 1/k of it); returns their new tokens."""
    new = 0
    for out in outputs:
        if out.request_id not in text_ids:
            continue
        n = len(out.token_ids)
        t_prev, n_prev = last.get(out.request_id, (None, 0))
        if t_prev is not None and n > n_prev:
            gaps += [(now - t_prev) / (n - n_prev)] * (n - n_prev)
        new += n - n_prev
        last[out.request_id] = (now, n)
    return new


def run_mixed(
    bench: Bench, concurrency: int, output_tokens: int, alone_steps: int, max_model_len: int
) -> MixedResult:
    """Text requests decoding; `alone_steps` steps timed; then `concurrency` image requests of
    `output_tokens` each arrive together and the steps until the last finishes are timed."""
    engine = bench.engine
    text_params = SamplingParams(
        max_tokens=max_model_len - QUESTION_TOKENS - 1, temperature=0.0, ignore_eos=True
    )
    texts = {bench.add(shapes.random_text(bench.config, QUESTION_TOKENS, 50 + i), text_params)
             for i in range(NUM_TEXT)}  # fmt: skip
    last: dict[str, tuple[float, int]] = {}
    warm: list[float] = []
    while len(last) < NUM_TEXT or min(n for _, n in last.values()) < 2:  # all decoding
        _track(engine.step(), texts, last, warm, time.perf_counter())
    result = MixedResult(concurrency, output_tokens, 0.0, 0, 0)
    for _ in range(alone_steps):
        _track(engine.step(), texts, last, result.tpot_alone_s, time.perf_counter())
    image_params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
    prompts = [bench.prompt() for _ in range(concurrency)]
    start = time.perf_counter()
    images = {bench.add(ids, image_params, pictures) for ids, pictures in prompts}
    started: set[str] = set()
    done: dict[str, object] = {}
    while len(done) < concurrency:
        outputs = engine.step()
        now = time.perf_counter()
        gaps = result.tpot_prefill_s if len(started) < concurrency else result.tpot_decode_s
        result.text_output_tokens += _track(outputs, texts, last, gaps, now)
        for out in outputs:
            if out.request_id in images and out.token_ids:
                started.add(out.request_id)
                if out.finished:
                    done[out.request_id] = out
    result.images_s = time.perf_counter() - start
    result.image_output_tokens = sum(len(out.token_ids) for out in done.values())
    result.image_ttft_s = [
        out.metrics.first_token_time - out.metrics.arrival_time for out in done.values()
    ]
    for rid in texts:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return result


def build_engine(folder: Path, args: argparse.Namespace) -> LLMEngine:
    """The engine with a seat for every request of the run (a TTFT-only run: a few, so a
    model with linear-attention state keeps its state pool small)."""
    seats = 4 if args.skip_throughput else args.concurrency + NUM_TEXT
    return LLMEngine(
        str(folder), device=args.device, dtype=args.dtype, load_format="random",
        max_model_len=args.max_model_len, max_num_seqs=seats,
    )  # fmt: skip


def measure(args: argparse.Namespace) -> tuple[TTFTResult, MixedResult | None]:
    """Both parts on one engine (the TTFT's warm-up also warms the throughput part), then the
    GEMM rates with the engine's memory given back."""
    config = shapes.checkpoint_config(args.model, args.tiny)
    with tempfile.TemporaryDirectory() as tmp:
        folder = shapes.write_folder(config, Path(tmp) / f"{args.model}-vision")
        bench = Bench(args.model, args.tiny, build_engine(folder, args))
        ttfts, encoder_ms, n_tokens = run_ttft(bench, args.repeats, args.warmups)
        if args.profile:  # one more request, with an image not seen yet
            lines = top_ops(partial(run_ttft, bench, 1, 0), args.profile, args.device)
            print("\n".join(["one TTFT request under the profiler:", *lines]))
        mixed = None
        if not args.skip_throughput:
            mixed = run_mixed(
                bench, args.concurrency, args.output_tokens, args.alone_steps, args.max_model_len
            )
    image = bench.image
    del bench
    gc.collect()
    if torch.device(args.device).type == "cuda":
        torch.cuda.empty_cache()
    enc = shapes.encoder_shape(config)
    text = shapes.text_shape(config)
    v, t = config["vision_config"], config["text_config"]
    dtype = DTYPES[args.dtype]
    vision_rate = prefill_matmul_rate(args.device, dtype, image.num_patches,
                                      v["hidden_size"], v["intermediate_size"])  # fmt: skip
    text_rate = prefill_matmul_rate(args.device, dtype, n_tokens,
                                    t["hidden_size"], t["intermediate_size"])  # fmt: skip
    ttft = TTFTResult(
        ttfts, encoder_ms, n_tokens, image.num_patches,
        shapes.encoder_flops(enc, image.num_patches, image.num_tokens),
        prefill_flops(text, n_tokens), vision_rate.flops, text_rate.flops,
    )  # fmt: skip
    return ttft, mixed


def report(args: argparse.Namespace, ttft: TTFTResult, mixed: MixedResult | None) -> list[str]:
    """The printed lines."""
    best, median = min(ttft.ttft_s), statistics.median(ttft.ttft_s)
    tiny = " (tiny)" if args.tiny else ""
    goal = f" (goal <= {GOAL})" if args.model == "gemma3-12b" and not args.tiny else ""
    lines = [
        f"{args.model}{tiny}, {args.device}, {args.dtype}, random weights",
        f"TTFT, one image ({ttft.num_patches} patches) + {QUESTION_TOKENS}-token question, "
        f"{ttft.prompt_tokens} prompt tokens: best {best * 1e3:.1f} ms, median "
        f"{median * 1e3:.1f} ms of {len(ttft.ttft_s)} (encoder median "
        f"{statistics.median(ttft.encoder_ms):.1f} ms)",
        f"floor: encoder {ttft.encoder_flops / 1e9:.4g} GFLOP at {ttft.vision_rate / 1e12:.4g} "
        f"TFLOP/s + prompt {ttft.text_flops / 1e9:.4g} GFLOP at {ttft.text_rate / 1e12:.4g} "
        f"TFLOP/s = {ttft.floor_s * 1e3:.1f} ms",
        f"ratio TTFT / floor: best {best / ttft.floor_s:.2f}, median "
        f"{median / ttft.floor_s:.2f}{goal}",
    ]
    if mixed is not None:
        alone = statistics.median(mixed.tpot_alone_s)
        out_all = mixed.image_output_tokens + mixed.text_output_tokens
        lines += [
            f"{mixed.num_images} concurrent image requests ({mixed.output_tokens} output tokens "
            f"each) beside {NUM_TEXT} decoding text requests: {mixed.images_s:.2f} s, "
            f"{mixed.num_images / mixed.images_s:.2f} image requests/s, "
            f"{mixed.image_output_tokens / mixed.images_s:.0f} image output tok/s "
            f"({out_all / mixed.images_s:.0f} with the text requests'), image TTFT median "
            f"{statistics.median(mixed.image_ttft_s) * 1e3:.0f} ms",
            f"text decode TPOT: alone median {alone * 1e3:.2f} ms; while the images encode and "
            f"prefill {_median_max_ms(mixed.tpot_prefill_s, alone)}; until the last image "
            f"request ends {_median_max_ms(mixed.tpot_with_images_s, alone)}",
        ]
    return lines


def _median_max_ms(gaps: list[float], alone: float) -> str:
    if not gaps:
        return "n/a (no text token)"
    median = statistics.median(gaps)
    return f"median {median * 1e3:.2f} ms ({median / alone:.2f}x), max {max(gaps) * 1e3:.1f} ms"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=(*shapes.MODELS, "tiny"), default="gemma3-12b")
    parser.add_argument("--tiny", action="store_true", help="small layers (a CPU run)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None)
    parser.add_argument("--concurrency", type=int, default=32, help="image requests at once")
    parser.add_argument("--output-tokens", type=int, default=64, help="per image request")
    parser.add_argument("--repeats", type=int, default=5, help="TTFT requests timed")
    parser.add_argument("--warmups", type=int, default=1)
    parser.add_argument("--alone-steps", type=int, default=32, help="text-only steps timed")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument(
        "--profile", type=int, default=0, help="profile one more TTFT request: its top N ops"
    )
    parser.add_argument("--out", type=Path, help="a folder for the figures' JSON")
    args = parser.parse_args(argv)
    if args.model == "tiny":
        args.model, args.tiny = "gemma3-12b", True
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    ttft, mixed = measure(args)
    print("\n".join(report(args, ttft, mixed)))
    figures = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "ttft": {**asdict(ttft), "floor_s": ttft.floor_s},
        "throughput": asdict(mixed) if mixed is not None else None,
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        tiny = "-tiny" if args.tiny else ""
        (args.out / f"bench_vision_{args.model}{tiny}.json").write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
