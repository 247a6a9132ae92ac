"""The n-gram drafter: proposes what followed the latest earlier occurrence of the longest
matching suffix, agrees with a plain backward scan at every step, and follows each request's
tokens incrementally (placeholders skipped, a changed sequence re-indexed)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pytest

from engine.scheduling.request import PLACEHOLDER
from engine.spec.ngram import NgramDrafter, NgramIndex


@dataclass
class Req:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    num_pending: int = 0


def scan(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The reference: search backwards through the whole sequence."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        suffix = tokens[length - n :] if length > n else None
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_proposes_the_continuation_of_the_longest_latest_match():
    drafter = NgramDrafter(min_n=1, max_n=3)
    #            0  1  2  3  4  5  6  7  8  9 10 11
    req = Req("a", [1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 2, 3])
    # suffix [2, 3]: occurs at 1 (then 9) and at 5 (then 7 8 5 2): the latest wins
    assert drafter.propose([req], 3)[0].token_ids == [7, 8, 5]
    assert drafter.propose([req], 10)[0].token_ids == [7, 8, 5, 2, 3]  # up to the end
    req.token_ids += [7, 1]  # suffix [7, 1] is new; [1] occurred at 0: propose what followed
    assert drafter.propose([req], 2)[0].token_ids == [2, 3]
    req.token_ids += [42]
    assert drafter.propose([req], 2)[0].token_ids == []  # 42 never seen before
    assert NgramDrafter(min_n=2, max_n=3).propose([Req("b", [5, 6, 7, 5])], 2)[0].token_ids == []


@pytest.mark.parametrize(("min_n", "max_n"), [(1, 1), (2, 4), (1, 5)])
def test_agrees_with_a_backward_scan_at_every_step(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    tokens: list[int] = []
    while len(tokens) < 600:  # random text with copied spans, from a small vocabulary
        if len(tokens) > 20 and rng.random() < 0.4:
            start = rng.randrange(len(tokens) - 10)
            tokens += tokens[start : start + rng.randint(2, 12)]
        else:
            tokens += [rng.randrange(12) for _ in range(rng.randint(1, 6))]
    drafter = NgramDrafter(min_n, max_n)
    req = Req("r", tokens[:3])
    hits = 0
    for token in tokens[3:]:
        req.token_ids.append(token)
        k = rng.randint(1, 8)
        got = drafter.propose([req], k)[0].token_ids
        assert got == scan(req.token_ids, k, min_n, max_n)
        hits += bool(got)
    assert hits > 300


def test_follows_requests_incrementally():
    drafter = NgramDrafter(min_n=2, max_n=2)
    a, b = Req("a", [1, 2, 3, 1, 2]), Req("b", [4, 5, 6, 4, 5])
    assert [d.token_ids for d in drafter.propose([a, b], [2, 0])] == [[3, 1], []]
    assert [d.token_ids for d in drafter.propose([a, b], [2, 1])] == [[3, 1], [6]]
    # a token sampled but not read back (overlapped steps) is not indexed nor matched
    a.token_ids.append(PLACEHOLDER)
    a.num_pending = 1
    assert drafter.propose([a], 2)[0].token_ids == [3, 1]
    a.token_ids[-1], a.num_pending = 3, 0
    assert drafter.propose([a], 4)[0].token_ids == [1, 2, 3]  # suffix [2, 3] -> 1 2 3
    # a sequence that no longer extends what was indexed (recomputed differently) is re-indexed
    a.token_ids = [1, 2, 8, 1, 2]
    assert drafter.propose([a], 2)[0].token_ids == [8, 1]
    drafter.release("a")
    drafter.release("never-seen")
    assert drafter.propose([a], 2)[0].token_ids == [8, 1]


def test_index_grows_by_one_entry_per_size_and_token():
    index = NgramIndex(min_n=2, max_n=4)
    index.extend(list(range(100)))
    assert {n: len(index.after[n]) for n in index.after} == {2: 98, 3: 97, 4: 96}
    with pytest.raises(ValueError, match="token ids"):
        index.extend([-1])


def test_bad_arguments():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramDrafter(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramDrafter(min_n=0)
    drafter = NgramDrafter()
    with pytest.raises(ValueError, match="2 draft lengths for 1 requests"):
        drafter.propose([Req("a", [1, 2])], [1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        drafter.propose([Req("a", [1, 2])], -1)


def test_acceptance_replay_counts_a_greedy_speculative_run():
    from benchmarks.bench_spec_acceptance import KINDS, PROMPTS_FILE, replay

    prompt = [1, 2, 3, 4, 5, 6]
    answer = [1, 2, 3, 4, 9, 1, 2]
    t = replay(prompt, answer, 3, NgramDrafter(min_n=1, max_n=2))
    # step 1: [6] never seen before: the model's token 1. Step 2: [1] -> drafts 2 3 4, all
    # right, then the model's 9. Step 3: [9] unseen: 1. Step 4: [1] -> one draft (one token
    # left), 2, right: the answer is complete
    assert (t.steps, t.drafted, t.accepted, t.steps_with_draft) == (4, 4, 4, 2)
    assert t.tokens_per_step == 7 / 4
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines()]
    assert 20 <= len(rows) <= 40
    assert {r["kind"] for r in rows} == set(KINDS)
