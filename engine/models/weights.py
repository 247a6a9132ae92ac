"""Checkpoint loading shared by the model families: a Hugging Face name mapped to our (fused)
parameter and row shard, the destination narrowed to that shard, the shape checked, the copy
done by the caller's `copy(dst, src)`, and at the end every parameter (each shard of a fused
one) checked filled. A family supplies its differences: prefixes, skipped names, the fused-name
table, the shard sizes, a transform of the tensor."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping

import torch
from torch import nn

Copy = Callable[[torch.Tensor, torch.Tensor], object]
"""copy(dst, src): does one copy (engine.models.loader's runs them on threads)."""


QKV_GATE_UP = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
"""Checkpoint name fragment -> (our fused parameter fragment, shard index): q/k/v into one
qkv_proj, gate/up into one gate_up_proj."""


def missing_error(where: str, missing: list[str], what: str = "weights") -> ValueError:
    """The error for a checkpoint that leaves `missing` (sorted names) unfilled; names the
    first five. `where`: "checkpoint" or "Gemma 3 checkpoint"."""
    return ValueError(
        f"{where} is missing {what}: {missing[:5]}"
        + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    )


def check_shape(name: str, tensor: torch.Tensor, dst: torch.Tensor) -> None:
    """Raise unless checkpoint tensor `name` has the shape of its destination `dst`."""
    if dst.shape != tensor.shape:
        raise ValueError(
            f"weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
        )


def fused_name(name: str, table: Mapping[str, tuple[str, int]]) -> tuple[str, int | None]:
    """Our parameter for a checkpoint name (prefix removed): (name, shard index), the first
    `.part.` of `table` (checkpoint fragment -> (our fused fragment, shard)) replaced; shard
    None for an unfused name."""
    for part, (fused, index) in table.items():
        if f".{part}." in name:
            return name.replace(part, fused), index
    return name, None


class WeightLoader:
    """Fills one model's parameters from checkpoint tensors and, at the end, raises on the ones
    left unfilled. `family` names the checkpoint in errors ("Gemma 3": "unexpected weight 'x'
    in a Gemma 3 checkpoint"; "": "... in checkpoint"). `prefixes`: the text model's name
    prefixes, tried in order; `skipped`: prefixes of weights not loaded (vision towers), counted.
    `loaded_elsewhere`: our parameter names the caller fills and checks itself (a subclass's
    experts)."""

    def __init__(
        self,
        model: nn.Module,
        copy: Copy,
        family: str = "",
        prefixes: tuple[str, ...] = ("model.",),
        skipped: tuple[str, ...] = (),
        loaded_elsewhere: Collection[str] = (),
    ) -> None:
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.copy = copy
        self.tied = model.config.tie_word_embeddings
        self.family = family
        self.prefixes = prefixes
        self.skipped = skipped
        self.loaded_elsewhere = loaded_elsewhere
        self.loaded: set[str] = set()  # f"{our parameter}#{shard}"
        self.num_skipped = 0

    def text_name(self, name: str) -> str | None:
        """`name` without the first of the prefixes it starts with; None for a weight not
        loaded: a skipped one (counted), a RoPE table, the LM head of a model tied to its
        embedding."""
        if name.startswith(self.skipped):
            self.num_skipped += 1
            return None
        name = next((name[len(p) :] for p in self.prefixes if name.startswith(p)), name)
        if "rotary_emb" in name or (name == "lm_head.weight" and self.tied):
            return None
        return name

    def log_skipped(self, logger: logging.Logger, what: str) -> None:
        """One log line counting the skipped weights (`what`: "vision tower weights")."""
        if self.num_skipped:
            logger.info("skipped %d %s (text generation only)", self.num_skipped, what)

    def unexpected(self, name: str) -> ValueError:
        where = f"a {self.family} checkpoint" if self.family else "checkpoint"
        return ValueError(f"unexpected weight {name!r} in {where}")

    def load(
        self,
        name: str,
        target: str,
        shard: int | None,
        sizes: list[int] | None,
        tensor: torch.Tensor,
    ) -> None:
        """Copy checkpoint tensor `name` into our parameter `target`, into rows `shard` of the
        fused parameter whose row blocks are `sizes` (shard None: the whole parameter)."""
        if target not in self.params or (
            shard is not None and (sizes is None or shard >= len(sizes))
        ):
            raise self.unexpected(name)
        dst = self.params[target]
        if shard is not None:
            dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
        check_shape(name, tensor, dst)
        self.copy(dst, tensor)
        self.mark(target, shard)

    def mark(self, target: str, shard: int | None = None) -> None:
        """Record `target` (its shard `shard`) as filled, by `load` or by the caller."""
        self.loaded.add(f"{target}#{shard}")

    def check_complete(self, num_shards: Callable[[str], int | None]) -> None:
        """Raise if a parameter, or a shard of a fused one, was not filled. `num_shards(name)`:
        how many shards our parameter `name` is fused from (None: not fused)."""
        expected = set()
        for pname in self.params:
            if pname in self.loaded_elsewhere or (pname == "lm_head.weight" and self.tied):
                continue
            parts = num_shards(pname)
            if parts is None:
                expected.add(f"{pname}#None")
            else:
                expected.update(f"{pname}#{i}" for i in range(parts))
        missing = sorted(expected - self.loaded)
        if missing:
            where = f"{self.family} checkpoint" if self.family else "checkpoint"
            raise missing_error(where, missing)


@torch.no_grad()
def load_fused(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    copy: Copy,
    shard_sizes: Mapping[str, list[int]],
    our_name: Callable[[str], tuple[str, int | None]],
    *,
    family: str = "",
    prefixes: tuple[str, ...] = ("model.",),
    skipped: tuple[str, ...] = (),
    skipped_what: str = "",
    logger: logging.Logger | None = None,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    loaded_elsewhere: Collection[str] = (),
) -> None:
    """Load `weights` into `model`, whose fused parameters are named by their second-last
    fragment (`layers.0.self_attn.qkv_proj.weight`: "qkv_proj"), a key of `shard_sizes` (that
    parameter's row blocks). `our_name(name)`: (our parameter, shard) of a checkpoint name with
    its prefix (the first of `prefixes` it starts with) removed. Names starting with one of
    `skipped` are counted and logged (`skipped_what`) on `logger`. `transform(target, tensor)`:
    the tensor to copy into our parameter `target` (e.g. Gemma's 1 + w), before the shape check.
    Raises on an unknown name, a wrong shape, or a parameter left unfilled."""
    loader = WeightLoader(model, copy, family, prefixes, skipped, loaded_elsewhere)
    for name, tensor in weights:
        name = loader.text_name(name)
        if name is None:
            continue
        target, shard = our_name(name)
        sizes = shard_sizes.get(target.split(".")[-2]) if shard is not None else None
        if transform is not None and target in loader.params:
            tensor = transform(target, tensor)
        loader.load(name, target, shard, sizes, tensor)
    if logger is not None:
        loader.log_skipped(logger, skipped_what)

    def num_shards(pname: str) -> int | None:
        fused = pname.split(".")[-2] if "." in pname else ""
        return len(shard_sizes[fused]) if fused in shard_sizes else None

    loader.check_complete(num_shards)
