"""The specialisation key of every Triton kernel launch the engine makes, over steps of many
token counts, batch sizes, decode/prefill mixes and context lengths, computed with Triton's own
binder on CPU tensors: no GPU, no launch. Run as `python -m tests.support.specialization_keys`
(tests/test_specialization_keys.py does, in a fresh process without Triton's interpreter, with
the venv's Triton and with the H200's 3.6).

Triton's JIT builds one kernel variant per key: the constexpr values, the types of the other
arguments, and their specialisations (an int equal to 1 becomes a constexpr, an int divisible
by 16 or a 16-byte-aligned pointer gets a divisibility hint). The binder that computes the key
at launch (`triton.runtime.jit.create_function_from_signature`, with the CUDA backend's rules,
which are BaseBackend's) is called here in place of the launch. Per kernel, the keys of all
steps must agree, except in the constexprs STEP_CONSTEXPRS names: each of those takes a few
values that LLMEngine.warm_up reaches on purpose. A launch argument that varies with the step
and is specialised shows up as a second key. Prints one line per kernel, `ok NAME: KEYS` or
`varies NAME: ...`, then `kernels: N`, then the count of keys a deliberately specialised
control kernel gets (the check must see it)."""

from __future__ import annotations

import os

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported

from collections import defaultdict  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

STEP_CONSTEXPRS = {
    # one split writes `out` (passed as ws_ptr too) or several the fp32 workspace
    "_decode_split_kernel": {"DIRECT_OUT", "ws_ptr"},
    "_rope_kernel": {"HEADS", "num_warps"},  # heads a program, below / from 64 tokens
    "_rope_store_kernel": {"HEADS", "num_warps"},
}
"""Constexprs (and launch options) that change with the step on purpose; warm-up covers each
value. PDL (batch 1 on Hopper) is another, off on the CPU."""

_keys: dict[tuple[str, str], dict[tuple, dict]] = defaultdict(dict)
_binders: dict[int, object] = {}
_group = ""


def _record(self, *args, grid, warmup, **kwargs):
    """JITFunction.run's stand-in: bind the arguments as the launch would, keep the key."""
    binder = _binders.get(id(self))
    if binder is None:
        binder = _binders[id(self)] = create_function_from_signature(
            self.signature, self.params, BaseBackend
        )
    _, specialization, options = binder(*args, **kwargs)
    name = self.fn.__name__
    allowed = STEP_CONSTEXPRS.get(name, set())
    named = {p.name: spec for p, spec in zip(self.params, specialization)}
    named.update({f"option {k}": ("option", v) for k, v in options.items()})
    key = tuple(
        (k, tuple(str(x) for x in v))
        for k, v in sorted(named.items())
        if k.removeprefix("option ") not in allowed
    )
    _keys[(name, _group)][key] = named


def keys_of(name: str, group: str = "") -> dict[tuple, dict]:
    return _keys[(name, group)]


BLOCK = 16
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER = 8, 2, 64, 256, 512
NUM_BLOCKS, MAX_MODEL_LEN = 512, 2048


def _requests(decode_lens: list[int], prefills: list[tuple[int, int]]):
    """A batch like the scheduler's: decodes (context length each, the new token included),
    then prefill chunks (cached prefix, chunk length), with block tables."""
    from engine.sampling_params import SamplingParams
    from engine.scheduling.request import Request
    from engine.scheduling.scheduler import ScheduledBatch

    params = SamplingParams(max_tokens=1)
    reqs, news, next_block = [], [], 0
    for i, (computed, new) in enumerate([(n - 1, 1) for n in decode_lens] + prefills):
        req = Request(f"r{i}", [1] * (computed + new), params, 0)
        req.num_computed_tokens = computed
        blocks = -(-(computed + new) // BLOCK)
        req.block_table = [(next_block + b) % NUM_BLOCKS for b in range(blocks)]
        next_block += blocks
        reqs.append(req)
        news.append(new)
    return ScheduledBatch(reqs, news, len(decode_lens))


def run_step(decode_lens: list[int], prefills: list[tuple[int, int]], kv_int8: bool) -> None:
    """The kernel calls of one eager step's layer (engine/models/llama.py's slicing), with the
    runner's input tensors (engine/input_prep.prepare_inputs: views of one upload)."""
    from engine.kernels.rmsnorm import rms_norm
    from engine.kernels.rope import apply_rope
    from engine.kernels.rope_store import rope_store
    from engine.kernels.silu_mul import silu_and_mul
    from engine.runner.attention_triton import TritonBackend
    from engine.runner.input_prep import prepare_inputs

    global _group
    _group = "int8 KV" if kv_int8 else ""
    cpu, dt = torch.device("cpu"), torch.bfloat16
    batch = _requests(decode_lens, prefills)
    ids, positions, meta, _, _ = prepare_inputs(batch, BLOCK, cpu)
    t = ids.shape[0]
    x, residual = torch.empty(t, HIDDEN, dtype=dt), torch.empty(t, HIDDEN, dtype=dt)
    rms_norm(x, torch.ones(HIDDEN, dtype=dt), 1e-5, residual)
    qkv = torch.empty(t, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dt)
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q = q.view(t, HEADS, HEAD_DIM)
    k, v = k.view(t, KV_HEADS, HEAD_DIM), v.view(t, KV_HEADS, HEAD_DIM)
    _group = "q norm"
    rms_norm(q, torch.ones(HEAD_DIM, dtype=dt), 1e-5)  # Qwen3's per-head norm
    _group = "int8 KV" if kv_int8 else ""
    cos = sin = torch.empty(MAX_MODEL_LEN, HEAD_DIM)
    shape = (2, 2, NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM)  # [layers, K/V, ...]: layer 1's views
    cache = torch.empty(shape, dtype=torch.int8 if kv_int8 else dt)
    scales = torch.empty(shape[:-1], dtype=torch.float16) if kv_int8 else None
    kc, vc = cache[1, 0], cache[1, 1]
    ks, vs = (scales[1, 0], scales[1, 1]) if kv_int8 else (None, None)
    backend = TritonBackend()
    if not kv_int8:
        rope_store(q, k, v, positions, cos, sin, kc, vc, meta.slot_mapping)
    apply_rope(q, k, positions, cos, sin)
    backend.store_kv(k, v, kc, vc, meta.slot_mapping, ks, vs)
    backend.attention(q, kc, vc, meta, HEAD_DIM**-0.5, ks, vs)
    _group = "int8 KV, a sliding layer" if kv_int8 else "a sliding layer"
    variant = dict(window=128, softcap=30.0, sinks=torch.zeros(HEADS, dtype=dt))
    backend.attention(q, kc, vc, meta, HEAD_DIM**-0.5, ks, vs, **variant)
    _group = ""
    silu_and_mul(torch.empty(t, 2 * INTER, dtype=dt))
    _group = ""


def run_quant_rows(rows: int) -> None:
    """The quantized linears at `rows` rows: the decode-batch GEMM at its row bucket's configs
    and the tl.dot GEMM at its bucket's blocks (the autotuner's choices vary only those)."""
    global _group
    from engine.kernels import wq_gemm, wq_matmul

    dt, n, k = torch.bfloat16, 384, 1024
    x = torch.empty(rows, k, dtype=dt)
    int8 = (torch.empty(n, k, dtype=torch.int8), torch.ones(n), None, None, 0)
    group = 64
    int4 = (
        torch.empty(n, k // 2, dtype=torch.uint8),
        torch.ones(n, k // group),
        torch.linspace(-1, 1, 16),
        torch.empty(n, dtype=dt),
        group,
    )
    bucket = wq_gemm.bucket_for(rows)
    for kind, layer in (("int8", int8), ("int4", int4)):
        if bucket is not None and rows > 1:
            for config in wq_gemm.CONFIGS[kind][bucket]:
                _group = f"{kind} bucket {bucket} {config}"
                wq_gemm.wq_gemm(x, *layer, config, num_sms=132)
        m_bucket = wq_matmul._m_bucket(rows)
        for config in wq_matmul._CONFIGS[m_bucket]:
            _group = f"{kind} bucket {m_bucket} {config.kwargs}"
            block = tuple(config.kwargs[b] for b in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
            wq_matmul.wq_matmul(x, *layer[:4], group_size=group, block=block)
    _group = ""


def steps():
    """(decode context lengths, prefill (prefix, chunk)s) of the steps checked: single
    prompts of every length class, chunk continuations, decode batches of many sizes with
    short and long contexts, and mixes."""
    for n in (1, 2, 3, 7, 16, 17, 31, 63, 64, 65, 100, 255, 511, 512, 513, 1000, 2048):
        yield [], [(0, n)]
    for prefix in (1, 15, 16, 17, 512, 1001):
        yield [], [(prefix, 100)]
    for num, ctx in ((1, 5), (1, 300), (2, 17), (3, 64), (5, 1500), (16, 40), (33, 700)):
        yield [ctx + i for i in range(num)], []
    for num in (1, 2, 3, 4, 5, 8, 13):
        for ctx in (9, 65, 1200):
            yield [ctx] * num, [(0, 7), (3, 33)]
    yield [20, 30], [(0, 1)]


@triton.jit
def _control_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """No do_not_specialize on n: the check must report it varying."""
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, offs, mask=offs < n)


def main() -> None:
    print(f"triton {triton.__version__}")
    JITFunction.run = _record
    for kv_int8 in (False, True):
        for decode_lens, prefills in steps():
            run_step(decode_lens, prefills, kv_int8)
    for rows in (1, 2, 3, 9, 16, 17, 20, 32, 33, 50, 64, 65, 100, 128, 129, 200, 256):
        run_quant_rows(rows)
    for kernel_group, found in sorted(_keys.items()):
        name = " ".join(x for x in kernel_group if x)
        if len(found) == 1:
            print(f"ok {name}: 1")
            continue
        seen = defaultdict(set)
        for named in found.values():
            for arg, spec in named.items():
                seen[arg].add(str(spec))
        varying = {arg: sorted(values) for arg, values in seen.items() if len(values) > 1}
        print(f"varies {name}: {len(found)} keys, {varying}")
    print(f"kernels: {len(_keys)}")
    x = torch.empty(64)
    for n in (1, 2, 16, 17):
        _control_kernel[(1,)](x, n, BLOCK=64)
    print(f"control: {len(keys_of('_control_kernel'))}")


if __name__ == "__main__":
    main()
