"""The transformer body's hidden states of a micro-batch, a prefix that rows share computed once.

A stream's consecutive turns share their whole system prompt, and a GRPO group's rows their first
prompt: the plain forward computes those tokens once per row. Here rows are grouped by the longest
prefix they share (`prefix_groups`); the groups' prefixes run once, in one batch (their keys and values
kept), then every row's suffix attends to its group's keys and values, in a second batch, so that the
gradient reaches a prefix once, summed over its rows. A micro-batch's `Plan` says which: two passes, a row
in no group being a group of its own and a group whose long suffixes would pad the second batch more than
its prefix saves left out (`fewest_slots`), or the plain pass where no grouping computes fewer token slots.
Every rank of an FSDP2 job runs as many passes (`body_hidden`). The packer makes each micro-batch's Plan once,
from the rows' host copy, and bounds its token budget by the Plan's slots (learner/scoring.micro_batches).

The hidden states are those of the plain forward up to summation order (tests/integration/test_shared_prefix.py
gives the measured gaps), for sliding-window and chunked attention too: transformers masks those by cache
index, so where the passes are wider than the window every prefix is cut to the shortest, leaving no padding
between a row's prefix and its suffix (`two_passes`). A start-up probe compares the first two-pass forward of
each body with the plain one and stops sharing, saying so, beyond a tolerance (`probed`): an attention variant
nobody listed does not train on wrong log-probs unseen.

Rows are right-padded (attention_mask 1 then 0); a prefix stops at least one token before its
shortest row's end, so that every row keeps a suffix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from horizonrl.config import ConfigError
from horizonrl.engines.hf import cache_keyword
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.samples.tensors import Rows

log = logging.getLogger(__name__)

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
    one group (it skips (rows - 1) x prefix tokens) or splits where neighbours share least (the first such
    place), whichever skips more: a bottom-up pass over the Cartesian tree of the neighbours' common prefixes
    (each node the split of the run it spans), then a top-down pass that keeps the runs chosen whole. Both
    passes are loops, not recursion: rows that tie (a GRPO group) or chain (a stream's growing history) make
    the tree as deep as the rows. O(n log n) for the sort, O(n) after it."""
    order = sorted(range(len(rows)), key=rows.__getitem__)
    shared = shared_with_previous([rows[i] for i in order])[1:]    # shared[k]: sorted rows k and k + 1
    left, right, root = min_cartesian_tree(shared)
    first, last = list(range(len(shared))), list(range(len(shared)))   # the neighbour pairs a node's run spans
    skipped, whole = [0] * len(shared), [False] * len(shared)
    for node in children_first(left, right, root):
        below = 0
        if left[node] >= 0:
            first[node], below = first[left[node]], skipped[left[node]]
        if right[node] >= 0:
            last[node], below = last[right[node]], below + skipped[right[node]]
        together = (last[node] - first[node] + 1) * shared[node] if shared[node] >= min_shared else 0
        whole[node] = together > 0 and together >= below
        skipped[node] = together if whole[node] else below
    groups, stack = [], [root] if root >= 0 else []
    while stack:                                                     # left runs before right ones
        node = stack.pop()
        if whole[node]:
            groups.append((order[first[node]:last[node] + 2], shared[node]))
        else:
            stack += [child for child in (right[node], left[node]) if child >= 0]
    return groups


def min_cartesian_tree(values: list[int]) -> tuple[list[int], list[int], int]:
    """(left child, right child, root) of each position of `values` (-1: none) in their min-Cartesian tree: a
    node's value is the least of the range it spans, the first least where several tie (a stack, O(n))."""
    left, right, stack = [-1] * len(values), [-1] * len(values), []
    for i, value in enumerate(values):
        popped = -1
        while stack and values[stack[-1]] > value:
            popped = stack.pop()
        left[i] = popped
        if stack:
            right[stack[-1]] = i
        stack.append(i)
    return left, right, stack[0] if stack else -1


def children_first(left: list[int], right: list[int], root: int) -> list[int]:
    """The tree's nodes, each after its children (a loop: the tree may be as deep as it has nodes)."""
    visited, stack = [], [root] if root >= 0 else []
    while stack:
        node = stack.pop()
        visited.append(node)
        stack += [child for child in (left[node], right[node]) if child >= 0]
    return visited[::-1]


def row_tokens(input_ids: Tensor, attention_mask: Tensor) -> list[list[int]]:
    """Each right-padded row's tokens, without its padding."""
    return [ids[:n] for ids, n in zip(input_ids.tolist(), attention_mask.sum(dim=1).tolist())]


def in_token_order(data: Rows, rows) -> tuple[list[int], list[list[int]]]:
    """`rows` (positions in data's [R, T] tensors) sorted by their tokens, rows that share a prefix next to each
    other (for micro-batches that share it, MicroBatchBudget.shared_prefix), and their tokens in that order: the
    one host copy of the rows that packing and every micro-batch's `Plan` read."""
    rows = list(rows)
    tokens = row_tokens(data.input_ids[rows], data.attention_mask[rows])
    order = sorted(range(len(rows)), key=tokens.__getitem__)
    return [rows[i] for i in order], [tokens[i] for i in order]


def shared_with_previous(rows: list[list[int]]) -> list[int]:
    """For each row, the prefix it shares with the row before it (0 for the first), at most either's length
    less one: a shared prefix leaves every row a token of its own."""
    return [0] + [min(common_prefix(a, b), len(a) - 1, len(b) - 1) for a, b in zip(rows, rows[1:])]


def attention_window(config) -> int | None:
    """The fewest tokens a layer of a transformers model of `config` lets a token attend, counted by cache index
    (a sliding window, an attention chunk); None when every layer attends the whole row. transformers builds
    those masks by cache index, not position: `two_passes` aligns prefixes where padding would shift them. A layer
    type it does not know is a ConfigError naming the model's layout."""
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:                                # Mistral's layout: one window for every layer, or none
        return getattr(config, "sliding_window", None) or None
    spans = {"full_attention": None, "sliding_attention": getattr(config, "sliding_window", None),
             "chunked_attention": getattr(config, "attention_chunk_size", None)}
    unknown = sorted(set(layer_types) - set(spans))
    if unknown:
        raise ConfigError(f"optim.shared_prefix: {type(config).__name__} has layers of type {', '.join(unknown)} "
                          f"(layer_types: {sorted(set(layer_types))}), for which a shared prefix is not known to be "
                          "exact; set optim.shared_prefix: false")
    windows = [spans[kind] for kind in set(layer_types) if spans[kind] is not None]
    return min(windows) if windows else None


@dataclass(frozen=True)
class Plan:
    """How `body_hidden` runs a micro-batch of rows of `lengths` tokens: in two passes, `groups` (row positions,
    prefix length) holding every row, or, with no groups, in one plain pass. `min_shared` and `window` are the
    sharing it was planned for (`plan`; min_shared None: packed without sharing, which a body that shares plans
    again)."""

    lengths: list[int]
    groups: list[tuple[list[int], int]]
    min_shared: int | None = MIN_SHARED_TOKENS
    window: int | None = None

    def slots(self) -> int:
        """The token slots the forward computes, padding included (what a token budget bounds): rows x longest
        row in one pass; groups x longest prefix + rows x longest suffix in two."""
        if not self.groups:
            return len(self.lengths) * max(self.lengths, default=0)
        return len(self.groups) * max(prefix for _, prefix in self.groups) + len(self.lengths) * self.longest_suffix()

    def longest_suffix(self) -> int:
        return max(self.lengths[row] - prefix for group, prefix in self.groups for row in group)

    def computed(self) -> int:
        """The real tokens among the slots: each group's prefix once, then every row's suffix."""
        return sum(self.lengths) - self.skipped()

    def skipped(self) -> int:
        """The row tokens a group's single prefix stands for."""
        return sum((len(group) - 1) * prefix for group, prefix in self.groups)


def plan(rows: list[list[int]], min_shared: int = MIN_SHARED_TOKENS, window: int | None = None) -> Plan:
    """The Plan of the fewest slots for `rows` (token lists, no padding): `prefix_groups` chosen by
    `fewest_slots`, or the plain pass when no two-pass grouping computes fewer."""
    return fewest_slots(list(map(len, rows)), prefix_groups(rows, min_shared), min_shared, window)


def fewest_slots(lengths: list[int], groups: list[tuple[list[int], int]], min_shared: int = MIN_SHARED_TOKENS,
                 window: int | None = None) -> Plan:
    """Of `groups` (prefix_groups of rows of `lengths` tokens), those whose two passes (`two_passes`) compute
    the fewest token slots, padding included; the plain pass when none computes fewer than it. `grouped_hidden`
    pads every prefix to the longest and every suffix to the longest, so a group whose suffixes are long can
    cost the batch more than its prefix saves (its rows then run alone). The groups with the longest suffixes
    are left out first."""
    def suffix(group: tuple[list[int], int]) -> int:
        return max(lengths[row] for row in group[0]) - group[1]

    by_suffix = sorted(groups, key=suffix, reverse=True)
    best = Plan(lengths, [], min_shared, window)
    for left_out in range(len(by_suffix)):
        shared = Plan(lengths, two_passes(lengths, by_suffix[left_out:], window), min_shared, window)
        worth = all(prefix >= min_shared for group, prefix in shared.groups if len(group) > 1)  # `window` cut none
        if shared.skipped() and worth and shared.slots() < best.slots():
            best = shared
    return best


def two_passes(lengths: list[int], groups: list[tuple[list[int], int]], window: int | None = None
               ) -> list[tuple[list[int], int]]:
    """`groups` and every other row alone (its prefix all its tokens but the last), as `grouped_hidden` runs
    them. Where the two passes are wider than an attention `window`, every prefix is cut to the shortest, so
    that no padding lies between a row's prefix and its suffix: a token's cache index is then its position, as
    transformers' sliding-window and chunked masks assume (a row's padding at its end attends nothing)."""
    grouped = {row for group, _ in groups for row in group}
    every = groups + [([row], max(length - 1, 0)) for row, length in enumerate(lengths) if row not in grouped]
    widest = max(prefix for _, prefix in every) + max(lengths[row] - prefix for group, prefix in every
                                                      for row in group)
    if window is None or widest <= window:
        return every
    shortest = min(prefix for _, prefix in every)
    return [(group, shortest) for group, _ in every]


PROBE_TOLERANCE, PROBE_TOLERANCE_AUTOCAST = 1e-3, 5e-2      # the start-up probe's largest relative difference


class Sharing:
    """A body's prefix sharing, the argument of `body_hidden` that makes it share: the least prefix it shares, the
    keyword its forward takes a KV cache by (engines.hf.cache_keyword), its attention window (`attention_window`),
    the ranks that must run as many passes, and the row tokens its passes have attended (`tokens`) and of them those
    a shared prefix's single pass stood for (`skipped`), since `taken`. `probe_gap`: the start-up probe's difference
    (None until it ran); `on`: False once the probe stopped the sharing. A plain class, not a dataclass: FSDP2's cast
    of a forward's inputs copies dataclasses, and the counts must stay this object's."""

    def __init__(self, min_shared: int, cache_keyword: str, window: int | None = None, ranks: Ranks = LOCAL):
        self.min_shared, self.cache_keyword, self.window, self.ranks = min_shared, cache_keyword, window, ranks
        self.tokens = self.skipped = 0
        self.probe_gap: float | None = None
        self.on = True

    def taken(self) -> tuple[int, int]:
        """(tokens, skipped) so far, and the counts start again."""
        counts, self.tokens, self.skipped = (self.tokens, self.skipped), 0, 0
        return counts


def prefix_sharing(body, min_shared: int = MIN_SHARED_TOKENS, ranks: Ranks = LOCAL) -> Sharing:
    """The Sharing with which `body_hidden` of `body` shares prefixes of at least `min_shared` tokens. ConfigError
    for an attention layout `attention_window` does not know."""
    return Sharing(min_shared, cache_keyword(body), attention_window(body.config), ranks)


@dataclass(frozen=True)
class NetworkSharing:
    """The prefix sharing of a run's networks, the Sharing each one's forward takes (None: every row in full). A LoRA
    run's reference is its actor with the adapters off: one body, one Sharing."""

    actor: Sharing | None = None
    reference: Sharing | None = None
    critic: Sharing | None = None

    def bodies(self) -> list[Sharing]:
        """Each body's Sharing once."""
        return list({id(s): s for s in (self.actor, self.critic, self.reference) if s is not None}.values())


UNSHARED = NetworkSharing()   # every network computes every row in full


def body_hidden(body, input_ids: Tensor, attention_mask: Tensor, sharing: Sharing | None = None,
                micro_batch: Plan | None = None) -> Tensor:
    """body(input_ids, attention_mask).last_hidden_state [B, T, H] (`body`: a transformers base model, e.g.
    LlamaModel); with a `sharing` that is on, the micro-batch runs as its Plan says (`micro_batch`: the packer's,
    made once from the rows' host copy, learner/scoring.micro_batches; None or planned for other sharing: `plan` of
    its rows): one plain pass when no rank's plan shares (every rank agrees, so that an FSDP2 job's ranks run as
    many passes), else two (`grouped_hidden`), a rank with nothing to share running its rows alone. The first
    two-pass forward of each body is checked against the plain one (`probed`)."""
    if sharing is None or not sharing.on:
        return plain_hidden(body, input_ids, attention_mask)
    if micro_batch is None or (micro_batch.min_shared, micro_batch.window) != (sharing.min_shared, sharing.window) \
            or len(micro_batch.lengths) != input_ids.shape[0]:
        micro_batch = plan(row_tokens(input_ids, attention_mask), sharing.min_shared, sharing.window)
    sharing.tokens += sum(micro_batch.lengths)
    if not sharing.ranks.max(int(bool(micro_batch.groups))):
        return plain_hidden(body, input_ids, attention_mask)
    if not micro_batch.groups:                  # another rank shares: this one's rows alone, in two passes too
        micro_batch = Plan(micro_batch.lengths, two_passes(micro_batch.lengths, [], sharing.window))
    sharing.skipped += micro_batch.skipped()
    order = [row for group, _ in micro_batch.groups for row in group]
    hidden = grouped_hidden(body, input_ids[order], attention_mask[order],
                            [(len(group), prefix) for group, prefix in micro_batch.groups],
                            micro_batch.longest_suffix(), sharing.cache_keyword)
    hidden = hidden[torch.argsort(torch.tensor(order, device=input_ids.device))]     # back in the rows' order
    return hidden if sharing.probe_gap is not None else probed(body, sharing, input_ids, attention_mask, hidden)


def probed(body, sharing: Sharing, input_ids: Tensor, attention_mask: Tensor, hidden: Tensor) -> Tensor:
    """The start-up probe, on a body's first two-pass micro-batch: the largest relative difference of a real
    token's hidden state, |shared - plain| / |plain| (L2 over the hidden size; the largest of any rank's), against
    PROBE_TOLERANCE (fp32; PROBE_TOLERANCE_AUTOCAST under autocast or in a lower precision). Within it `hidden`
    goes on; beyond it the body stops sharing, saying so, and the micro-batch is the plain forward's: an attention
    variant the sharing does not handle cannot train on wrong log-probs. (Measured gaps:
    tests/integration/test_shared_prefix.py.)"""
    with torch.no_grad():
        plain = plain_hidden(body, input_ids, attention_mask)
    real = attention_mask.bool()
    shared, reference = hidden.detach()[real].float(), plain[real].float()
    difference = ((shared - reference).norm(dim=-1) / reference.norm(dim=-1).clamp_min(1e-6)).max()
    sharing.probe_gap = max(sharing.ranks.gather(float(difference)))
    low_precision = torch.is_autocast_enabled(input_ids.device.type) or plain.dtype != torch.float32
    tolerance = PROBE_TOLERANCE_AUTOCAST if low_precision else PROBE_TOLERANCE
    if sharing.probe_gap <= tolerance:
        log.info("optim.shared_prefix: the shared-prefix forward of %s is the plain one's within %.3g (tolerance %g)",
                 type(body).__name__, sharing.probe_gap, tolerance)
        return hidden
    log.warning("optim.shared_prefix: the shared-prefix forward of %s (attention window: %s) differs from the plain "
                "forward by %.3g (largest relative difference of a token's hidden state; tolerance %g) on its first "
                "shared micro-batch: this body computes every row in full from here on", type(body).__name__,
                sharing.window, sharing.probe_gap, tolerance)
    sharing.on = False
    return plain_hidden(body, input_ids, attention_mask)


def plain_hidden(body, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    return body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


def grouped_hidden(body, input_ids: Tensor, attention_mask: Tensor, groups: list[tuple[int, int]],
                   longest_suffix: int, keyword: str) -> Tensor:
    """Hidden states [n, T, H] of n right-padded rows in consecutive groups, (rows, prefix length) each, whose
    rows share their group's first `prefix` tokens; `longest_suffix`: the most tokens a row has past its
    prefix; `keyword`: the body's cache keyword.

    Two passes of the body, however many groups: the G prefixes as one right-padded batch [G, P] (its keys and
    values kept), then every row's suffix [n, S] over its group's keys and values, gathered to the rows (the
    attention mask hides a shorter prefix's padding; positions continue from the row's own prefix). The rows'
    hidden states are the prefix's then the suffix's, gathered back to each row's token positions. Where no row
    has a prefix (rows of at most one token), the suffixes are the rows: the plain forward, beside a one-token
    pass that stands for the first (its output times zero), so that the pass count is the same."""
    device = input_ids.device
    longest_prefix = max(prefix for _, prefix in groups)
    if longest_prefix == 0:
        first = plain_hidden(body, input_ids[:1, :1], torch.ones_like(input_ids[:1, :1]))
        return plain_hidden(body, input_ids, attention_mask) + 0.0 * first.sum()
    sizes = torch.tensor([size for size, _ in groups], device=device)
    prefixes = torch.tensor([prefix for _, prefix in groups], device=device)
    row_group = torch.repeat_interleave(torch.arange(len(groups), device=device), sizes)
    row_prefix, lengths = prefixes[row_group], attention_mask.sum(dim=1)
    n, width = input_ids.shape

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
