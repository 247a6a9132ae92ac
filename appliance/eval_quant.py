"""`appliance eval-quant`: what quantization does to the answers, measured on your prompts.

Runs one prompt set through the unquantized model (the baseline: the dtype the engine picks,
fp32 on a CPU, bf16 on most GPUs) and through each quantized configuration, one engine at a
time, and compares: greedy token agreement (first divergence per prompt), perplexity on a
reference text, and the mean KL(baseline || quantized) of next-token distributions. The
distributions are teacher-forced through the engine (engine.runner.scoring), so attention reads the
quantized KV cache exactly as in serving; they are scored on the reference text and on each
prompt followed by the baseline's answer. KL is computed over the baseline's top-K tokens plus
one bucket for the rest of the vocabulary (a lower bound of the full KL, tight when the top-K
hold nearly all the mass; K = 256).

Exit status: 0 all good, 1 a --min-agreement / --max-kl / --max-ppl-increase threshold missed,
3 a configuration failed to run (its error is reported, the others still run).
"""

from __future__ import annotations

import gc
import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_PROMPTS = DATA / "eval_prompts.jsonl"
DEFAULT_REFERENCE = DATA / "eval_reference.txt"
DEFAULT_CONFIGS = "w8,w4,kv8"
TOP_K = 256
POSITION_BUCKET = 256


@dataclass
class Prompt:
    prompt: str
    max_tokens: int = 32
    category: str = ""
    expect: str | None = None
    """Text a correct answer contains (reported as a hit count), if known."""


def load_prompts(path: str | Path) -> list[Prompt]:
    """JSONL: one object per line with "prompt" and optional "max_tokens", "category",
    "expect"; blank lines are skipped."""
    prompts = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(
                Prompt(
                    prompt=str(row["prompt"]),
                    max_tokens=int(row.get("max_tokens", 32)),
                    category=str(row.get("category", "")),
                    expect=row.get("expect"),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{i}: expected a JSON object with a 'prompt': {exc}") from exc
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def parse_configs(spec: str) -> list[tuple[str, dict]]:
    """'w8,w4,kv8,w8kv8' -> [(name, engine kwargs)]: w8/w4 = int8/int4 weights, kv8 = int8
    KV cache, combinable."""
    out = []
    for name in (s.strip() for s in spec.split(",")):
        m = re.fullmatch(r"(w(8|4))?(kv8)?", name)
        if not name or m is None:
            raise ValueError(f"unknown config {name!r}; use w8, w4, kv8 or a mix like w8kv8")
        kwargs = {}
        if m.group(2):
            kwargs["quantization"] = "int8" if m.group(2) == "8" else "int4"
        if m.group(3):
            kwargs["kv_cache_dtype"] = "int8"
        out.append((name, kwargs))
    return out


@dataclass
class Options:
    """How prompts are fed and texts scored."""

    reference_texts: list[str]
    """Texts scored for perplexity (teacher-forced through the engine)."""
    chat: bool = False
    """Wrap each prompt as a user message in the model's chat template."""
    chunk_size: int = 256
    """Tokens per teacher-forced prefill chunk."""
    max_score_tokens: int = 1024
    """Tokens of each reference text scored (also capped by max_model_len)."""


@dataclass
class _Reference:
    """The baseline's per-position top-K distributions of one scored sequence."""

    top_ids: list = field(default_factory=list)  # per chunk: [m, K] int64 (CPU)
    top_logprobs: list = field(default_factory=list)  # per chunk: [m, K] fp32 (CPU)


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _score(engine, sequences, refs, chunk_size):
    """Teacher-force each sequence. refs None: build the baseline top-K references; else KL
    against them. Returns (per-sequence NLL sums, counts, [(position, kl)] or None)."""
    import torch

    from engine.runner.scoring import iter_next_token_logprobs

    nll, counts, kls = [], [], []
    built = []
    for s, ids in enumerate(sequences):
        total, pos, ref = 0.0, 0, _Reference()
        chunks = iter_next_token_logprobs(engine, ids, chunk_size)
        for c, (targets, lp) in enumerate(chunks):
            total -= float(lp.gather(1, targets[:, None]).sum())
            m = targets.shape[0]
            if refs is None:
                top = lp.topk(min(TOP_K, lp.shape[1]), dim=1)
                ref.top_ids.append(top.indices.cpu())
                ref.top_logprobs.append(top.values.cpu())
            else:
                base = refs[s]
                ids_p = base.top_ids[c].to(lp.device)
                lp_p = base.top_logprobs[c].to(lp.device)
                lq = lp.gather(1, ids_p)  # [m, K]
                p = lp_p.exp()
                kl = (p * (lp_p - lq)).sum(1)
                p_tail = (1 - p.sum(1)).clamp(min=0.0)
                q_tail = (1 - lq.exp().sum(1)).clamp(min=1e-30)
                tail = torch.where(
                    p_tail > 0, p_tail * (p_tail.clamp(min=1e-30).log() - q_tail.log()), 0.0
                )
                kls.extend(zip(range(pos, pos + m), (kl + tail).clamp(min=0.0).tolist()))
            pos += m
        nll.append(total)
        counts.append(pos)
        built.append(ref)
    return nll, counts, (built if refs is None else kls)


def _run_config(model, device, dtype, engine_kwargs, prompts, opts: Options, refs) -> dict:
    """Load one engine, generate greedy answers, score. Returns a result dict; the engine is
    released before returning."""
    from engine import LLM

    start = time.perf_counter()
    llm = LLM(model, device=device, dtype=dtype, **engine_kwargs)
    try:
        result = _measure(llm, prompts, opts, refs)
    finally:
        del llm  # free this engine (weights, KV pool) before the next one loads
        gc.collect()
        _empty_cuda_cache()
    result["seconds"] = time.perf_counter() - start
    return result


def _measure(llm, prompts: list[Prompt], opts: Options, refs: dict | None) -> dict:
    from engine import SamplingParams

    engine = llm.engine
    max_len = engine.config.max_model_len
    if opts.chat:
        prompt_ids = [
            engine.apply_chat_template([{"role": "user", "content": p.prompt}]) for p in prompts
        ]
    else:
        prompt_ids = [engine.encode(p.prompt) for p in prompts]
    params = [
        SamplingParams(max_tokens=max(1, min(p.max_tokens, max_len - len(ids))), temperature=0)
        for p, ids in zip(prompts, prompt_ids)
    ]
    outs = llm.generate(prompt_ids, params)
    answers = [o.token_ids for o in outs]
    ref_ids = [
        engine.encode(t)[: min(max_len, opts.max_score_tokens)] for t in opts.reference_texts
    ]
    result = {
        "dtype": engine.config.dtype,
        "kv_cache_dtype": engine.config.kv_cache_dtype,
        "quantization": engine.config.quantization,
        "answer_ids": answers,
        "answers": [o.text for o in outs],
        "prompt_ids": prompt_ids,
        "reference_ids": ref_ids,
    }
    if any(len(r) < 2 for r in ref_ids):
        raise ValueError("every reference text needs at least 2 tokens")
    if refs is None:  # baseline: score reference texts + prompt + own answer
        answered = [(p + a)[:max_len] for p, a in zip(prompt_ids, answers)]
        sequences = ref_ids + [s for s in answered if len(s) >= 2]
    else:
        sequences = refs["sequences"]
    top = None if refs is None else refs["top"]
    nll, counts, extra = _score(engine, sequences, top, opts.chunk_size)
    num_ref = len(ref_ids)
    result["ppl_nll"], result["ppl_tokens"] = sum(nll[:num_ref]), sum(counts[:num_ref])
    result["sequences"], result["extra"] = sequences, extra
    return result


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _perplexity(nll: float, tokens: int) -> float | None:
    return math.exp(nll / tokens) if tokens else None


def _hits(prompts: list[Prompt], answers: list[str]) -> int:
    return sum(1 for p, a in zip(prompts, answers) if p.expect is not None and p.expect in a)


def _compare(base: dict, res: dict, prompts: list[Prompt]) -> dict:
    """The config's numbers against the baseline's."""
    divergences = [_first_divergence(b, q) for b, q in zip(base["answer_ids"], res["answer_ids"])]
    shares = [
        1.0 if d is None else d / max(len(b), len(q), 1)
        for d, b, q in zip(divergences, base["answer_ids"], res["answer_ids"])
    ]
    kls = res["extra"]
    buckets: dict[int, list[float]] = {}
    for pos, kl in kls:
        buckets.setdefault(pos // POSITION_BUCKET, []).append(kl)
    ppl = _perplexity(res["ppl_nll"], res["ppl_tokens"])
    base_ppl = base["perplexity"]
    return {
        "mean_agreement": sum(shares) / len(shares),
        "identical": sum(d is None for d in divergences),
        "first_divergence": divergences,
        "expected_hits": _hits(prompts, res["answers"]),
        "perplexity": ppl,
        "ppl_increase_pct": None if not (ppl and base_ppl) else 100.0 * (ppl / base_ppl - 1.0),
        "mean_kl": sum(k for _, k in kls) / len(kls) if kls else None,
        "max_kl": max((k for _, k in kls), default=None),
        "kl_by_position": [
            {
                "start": b * POSITION_BUCKET,
                "end": (b + 1) * POSITION_BUCKET,
                "mean_kl": sum(v) / len(v),
                "count": len(v),
            }
            for b, v in sorted(buckets.items())
        ],
        "answers": res["answers"],
        "seconds": res["seconds"],
    }


def evaluate(
    configs: list[tuple[str, dict]],
    prompts: list[Prompt],
    opts: Options,
    *,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    engine_kwargs: dict | None = None,
    progress=None,
) -> dict:
    """Run the baseline and every config; returns the report (JSON-ready). A config that
    fails to load or run is reported with its error instead of numbers."""
    common = dict(engine_kwargs or {})
    say = progress or (lambda msg: None)
    say("baseline: loading and generating")
    base = _run_config(model, device, dtype, common, prompts, opts, None)
    base["perplexity"] = _perplexity(base["ppl_nll"], base["ppl_tokens"])
    refs = {"sequences": base["sequences"], "top": base["extra"]}
    report = {
        "model": model or "embedded SmolLM2-135M-Instruct",
        "device": device,
        "prompts": [
            {
                "category": p.category,
                "prompt": p.prompt,
                "max_tokens": p.max_tokens,
                "expect": p.expect,
                "num_tokens": len(ids),
            }
            for p, ids in zip(prompts, base["prompt_ids"])
        ],
        "reference_tokens": base["ppl_tokens"],
        "scored_tokens": sum(len(s) - 1 for s in base["sequences"]),
        "kl_top_k": TOP_K,
        "baseline": {
            "dtype": base["dtype"],
            "kv_cache_dtype": base["kv_cache_dtype"],
            "perplexity": base["perplexity"],
            "expected_hits": _hits(prompts, base["answers"]),
            "answers": base["answers"],
            "seconds": base["seconds"],
        },
        "configs": [],
    }
    for name, kwargs in configs:
        say(f"{name}: loading and generating")
        entry = {"name": name, "engine_kwargs": kwargs, "ok": False, "error": None}
        try:
            res = _run_config(model, device, dtype, {**common, **kwargs}, prompts, opts, refs)
        except Exception as exc:  # report the config as failed, keep going
            entry["error"] = f"{type(exc).__name__}: {exc}"
        else:
            entry.update(ok=True, kv_cache_dtype=res["kv_cache_dtype"])
            entry.update(quantization=res["quantization"], **_compare(base, res, prompts))
        report["configs"].append(entry)
    return report


def check_thresholds(
    report: dict,
    min_agreement: float | None = None,
    max_kl: float | None = None,
    max_ppl_increase: float | None = None,
) -> list[str]:
    """One message per missed threshold (ppl increase in percent); failed configs excluded."""
    missed = []
    for c in report["configs"]:
        if not c["ok"]:
            continue
        name = c["name"]
        if min_agreement is not None and c["mean_agreement"] < min_agreement:
            missed.append(f"{name}: agreement {c['mean_agreement']:.3f} < {min_agreement}")
        if max_kl is not None and c["mean_kl"] is not None and c["mean_kl"] > max_kl:
            missed.append(f"{name}: mean KL {c['mean_kl']:.4g} > {max_kl}")
        inc = c["ppl_increase_pct"]
        if max_ppl_increase is not None and inc is not None and inc > max_ppl_increase:
            missed.append(f"{name}: perplexity +{inc:.2f}% > +{max_ppl_increase}%")
    return missed
