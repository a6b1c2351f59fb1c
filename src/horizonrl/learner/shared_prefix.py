"""The transformer body's hidden states of a micro-batch, a prefix that rows share computed once.

A stream's consecutive turns share their whole system prompt, and a GRPO group's rows their first
prompt: the plain forward computes those tokens once per row. Here rows are grouped by the longest
prefix they share (`prefix_groups`); the groups' prefixes run once, in one batch (their keys and values
kept), then every row's suffix attends to its group's keys and values, in a second batch, so that the
gradient reaches a prefix once, summed over its rows. Two passes whatever the rows (on the tiny toy model
a pass's fixed cost outweighs its tokens: one pair of passes per group made the update no faster; and
every rank of an FSDP2 job must run as many): a row in no group is a group of its own (`alone`), and a
group whose long suffixes would pad the second batch more than its prefix saves is left out
(`fewest_slots`). The hidden states are those of the plain forward up to
summation order (tests/integration/test_shared_prefix.py gives the measured gaps).

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
    LlamaModel); where `share_prefixes` made it share, the rows that share a prefix of at least its minimum
    run it once per group, and every other row is a group of its own (`grouped_hidden`: two passes of the
    body whatever the rows, so that every rank of an FSDP2 job runs as many)."""
    sharing: Sharing | None = getattr(body, SETTING, None)
    if sharing is None:
        return plain_hidden(body, input_ids, attention_mask)
    rows = row_tokens(input_ids, attention_mask)
    lengths = list(map(len, rows))
    groups = fewest_slots(lengths, prefix_groups(rows, sharing.min_shared))
    sharing.tokens += sum(lengths)
    sharing.skipped += sum((len(group) - 1) * prefix for group, prefix in groups)
    groups += alone(lengths, groups)
    order = [row for group, _ in groups for row in group]
    hidden = grouped_hidden(body, input_ids[order], attention_mask[order],
                            [(len(group), prefix) for group, prefix in groups], sharing.cache_keyword)
    return hidden[torch.argsort(torch.tensor(order, device=input_ids.device))]     # back in the rows' order


def alone(lengths: list[int], groups: list[tuple[list[int], int]]) -> list[tuple[list[int], int]]:
    """The rows in none of `groups`, each a group of its own: its prefix all its tokens but the last."""
    grouped = {row for group, _ in groups for row in group}
    return [([row], length - 1) for row, length in enumerate(lengths) if row not in grouped]


def fewest_slots(lengths: list[int], groups: list[tuple[list[int], int]]) -> list[tuple[list[int], int]]:
    """Of `groups` (prefix_groups of rows of `lengths` tokens), those that make `body_hidden` compute the fewest
    token slots, padding included: `grouped_hidden` pads every prefix to the longest and every suffix to the
    longest, so a group whose suffixes are long can cost the batch more than its prefix saves (its rows then
    run alone). The groups with the longest suffixes are left out first."""
    def suffix(group: tuple[list[int], int]) -> int:
        return max(lengths[row] for row in group[0]) - group[1]

    def slots(kept: list[tuple[list[int], int]]) -> int:
        every = kept + alone(lengths, kept)
        return len(every) * max(prefix for _, prefix in every) + len(lengths) * max(map(suffix, every))

    by_suffix = sorted(groups, key=suffix, reverse=True)
    return min((by_suffix[left_out:] for left_out in range(len(by_suffix) + 1)), key=slots)


def plain_hidden(body, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    return body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


def grouped_hidden(body, input_ids: Tensor, attention_mask: Tensor, groups: list[tuple[int, int]],
                   keyword: str) -> Tensor:
    """Hidden states [n, T, H] of n right-padded rows in consecutive groups, (rows, prefix length) each, whose
    rows share their group's first `prefix` tokens; `keyword`: the body's cache keyword.

    Two passes of the body, however many groups: the G prefixes as one right-padded batch [G, P] (its keys and
    values kept), then every row's suffix [n, S] over its group's keys and values, gathered to the rows (the
    attention mask hides a shorter prefix's padding; positions continue from the row's own prefix). The rows'
    hidden states are the prefix's then the suffix's, gathered back to each row's token positions."""
    device = input_ids.device
    sizes = torch.tensor([size for size, _ in groups], device=device)
    prefixes = torch.tensor([prefix for _, prefix in groups], device=device)
    row_group = torch.repeat_interleave(torch.arange(len(groups), device=device), sizes)
    row_prefix, lengths = prefixes[row_group], attention_mask.sum(dim=1)
    n, width, longest_prefix = input_ids.shape[0], input_ids.shape[1], int(prefixes.max())
    longest_suffix = int((lengths - row_prefix).max())

    first_rows = torch.cumsum(sizes, 0) - sizes
    head_positions = torch.arange(longest_prefix, device=device)
    head_mask = (head_positions < prefixes[:, None]).long()
    head_ids = input_ids[first_rows, :longest_prefix] * head_mask
    cache = DynamicCache()
    head = body(input_ids=head_ids, attention_mask=head_mask, use_cache=True, **{keyword: cache}).last_hidden_state

    tail_positions = row_prefix[:, None] + torch.arange(longest_suffix, device=device)
    tail_mask = (tail_positions < lengths[:, None]).long()
    tail_ids = input_ids.gather(1, tail_positions.clamp(max=width - 1)) * tail_mask
    row_cache = DynamicCache(ddp_cache_data=[(layer.keys[row_group], layer.values[row_group])
                                             for layer in cache.layers])
    tail = body(input_ids=tail_ids, attention_mask=torch.cat([head_mask[row_group], tail_mask], dim=1),
                position_ids=tail_positions, use_cache=True, **{keyword: row_cache}).last_hidden_state

    # position t of a row: its head's t before its prefix's end, else its suffix's t - prefix (padding: any)
    positions = torch.arange(width, device=device).expand(n, -1)
    suffix_index = (positions - row_prefix[:, None]).clamp(0, longest_suffix - 1)
    index = torch.where(positions < row_prefix[:, None], positions, longest_prefix + suffix_index)
    both = torch.cat([head[row_group], tail], dim=1)
    return both.gather(1, index[..., None].expand(-1, -1, both.shape[-1]))
