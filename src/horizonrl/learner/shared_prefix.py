"""The transformer body's hidden states of a micro-batch, a prefix that rows share computed once.

A stream's consecutive turns share their whole system prompt, and a GRPO group's rows their first
prompt: the plain forward computes those tokens once per row. Here rows are grouped by the longest
prefix they share (`prefix_groups`); a group runs its prefix once (one row, its keys and values kept),
then its rows' suffixes attend to those keys and values, expanded across the rows as views, so that
the gradient reaches the prefix once, summed over its rows. The hidden states are those of the plain
forward up to summation order (tests/integration/test_shared_prefix.py gives the measured gaps).

Rows are right-padded (attention_mask 1 then 0); a prefix stops at least one token before its
shortest row's end, so that every row keeps a suffix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from horizonrl.engines.hf import cache_keyword

MIN_SHARED_TOKENS = 32   # a shorter shared prefix is computed per row: two passes cost more than it saves


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def prefix_groups(rows: list[list[int]], min_shared: int = MIN_SHARED_TOKENS) -> list[tuple[list[int], int]]:
    """(row positions, shared prefix length) for the groups of `rows` (token lists, no padding) that share a
    prefix of at least `min_shared` tokens, chosen to skip the most prefix tokens; rows in no group are
    left out. A group's prefix ends at least one token before its shortest row's end.

    Rows sorted by their tokens put the rows with long common prefixes next to each other; the longest
    prefix a run of sorted rows shares is the least common prefix of neighbours in it. A run either stays
    one group (it skips (rows - 1) x prefix tokens) or splits where neighbours share least, whichever skips
    more (a Cartesian-tree recursion over the neighbours' common prefixes)."""
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    shared = shared_with_previous([rows[i] for i in order])[1:]

    def best(lo: int, hi: int) -> tuple[int, list[tuple[list[int], int]]]:   # sorted rows lo..hi-1
        if hi - lo < 2:
            return 0, []
        split = min(range(lo, hi - 1), key=lambda i: shared[i])
        whole = (hi - lo - 1) * shared[split] if shared[split] >= min_shared else 0
        left, right = best(lo, split + 1), best(split + 1, hi)
        if whole >= left[0] + right[0] and whole > 0:
            return whole, [(order[lo:hi], shared[split])]
        return left[0] + right[0], left[1] + right[1]

    return best(0, len(rows))[1]


def row_tokens(input_ids: Tensor, attention_mask: Tensor) -> list[list[int]]:
    """Each right-padded row's tokens, without its padding."""
    return [ids[:n] for ids, n in zip(input_ids.tolist(), attention_mask.sum(dim=1).tolist())]


def in_token_order(data: dict[str, Tensor], rows) -> tuple[list[int], list[int]]:
    """`rows` (positions in data's [R, T] tensors) sorted by their tokens, rows that share a prefix next to each
    other (for micro-batches that share it, MicroBatchBudget.shared_prefix), and shared_with_previous of them in
    that order."""
    rows = list(rows)
    tokens = row_tokens(data["input_ids"][rows], data["attention_mask"][rows])
    order = sorted(range(len(rows)), key=lambda i: tokens[i])
    return [rows[i] for i in order], shared_with_previous([tokens[i] for i in order])


def shared_with_previous(rows: list[list[int]]) -> list[int]:
    """For each row, the prefix it shares with the row before it (0 for the first), at most either's length
    less one: a shared prefix leaves every row a token of its own."""
    return [0] + [min(common_prefix(a, b), len(a) - 1, len(b) - 1) for a, b in zip(rows, rows[1:])]


SETTING = "horizonrl_shared_prefix"   # the attribute of a body that shares prefixes: its Sharing


@dataclass
class Sharing:
    """A body's prefix sharing: the least prefix it shares, the keyword its forward takes a KV cache by
    (engines.hf.cache_keyword), and the row tokens its passes have attended (`tokens`) and of them those a
    shared prefix's single pass stood for (`skipped`), since `taken`."""

    min_shared: int
    cache_keyword: str
    tokens: int = 0
    skipped: int = 0

    def taken(self) -> tuple[int, int]:
        """(tokens, skipped) so far, and the counts start again."""
        counts, self.tokens, self.skipped = (self.tokens, self.skipped), 0, 0
        return counts


def share_prefixes(body, min_shared: int = MIN_SHARED_TOKENS) -> Sharing:
    """Make `body_hidden` of `body` share prefixes of at least `min_shared` tokens; its counts."""
    setattr(body, SETTING, Sharing(min_shared, cache_keyword(body)))
    return getattr(body, SETTING)


def stop_sharing(body) -> None:
    """Make `body_hidden` of `body` the plain forward again (undoes share_prefixes)."""
    vars(body).pop(SETTING, None)


def body_hidden(body, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """body(input_ids, attention_mask).last_hidden_state [B, T, H] (`body`: a transformers base model, e.g.
    LlamaModel); where `share_prefixes` made it share, each group of rows sharing a prefix of at least its
    minimum runs the prefix once, else the plain forward."""
    sharing: Sharing | None = getattr(body, SETTING, None)
    if sharing is None or input_ids.shape[0] < 2:
        return plain_hidden(body, input_ids, attention_mask)
    rows = row_tokens(input_ids, attention_mask)
    groups = prefix_groups(rows, sharing.min_shared)
    sharing.tokens += sum(map(len, rows))
    sharing.skipped += sum((len(group) - 1) * prefix for group, prefix in groups)
    if not groups:
        return plain_hidden(body, input_ids, attention_mask)
    parts: list[tuple[list[int], Tensor]] = [(group, group_hidden(body, input_ids[group], attention_mask[group],
                                                                  prefix, sharing.cache_keyword))
                                             for group, prefix in groups]
    grouped = {row for group, _ in groups for row in group}
    alone = [row for row in range(len(rows)) if row not in grouped]
    if alone:
        parts.append((alone, plain_hidden(body, input_ids[alone], attention_mask[alone])))
    hidden = torch.cat([h for _, h in parts])
    where = torch.tensor([row for group, _ in parts for row in group], device=input_ids.device)
    return hidden[torch.argsort(where)]          # back in the rows' order


def plain_hidden(body, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    return body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


def group_hidden(body, input_ids: Tensor, attention_mask: Tensor, prefix: int, keyword: str) -> Tensor:
    """Hidden states [n, T, H] of n rows whose first `prefix` tokens are the same: the prefix's pass on one
    row, then the suffixes' pass over its keys and values expanded to the n rows (`keyword`: the body's
    cache keyword)."""
    n = input_ids.shape[0]
    prefix_cache = DynamicCache()
    head = body(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True,
                **{keyword: prefix_cache})
    cache = DynamicCache(ddp_cache_data=[(layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1))
                                         for layer in prefix_cache.layers])
    positions = torch.arange(prefix, input_ids.shape[1], device=input_ids.device).expand(n, -1)
    tail = body(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, position_ids=positions,
                use_cache=True, **{keyword: cache}).last_hidden_state
    return torch.cat([head.last_hidden_state.expand(n, -1, -1), tail], dim=1)
