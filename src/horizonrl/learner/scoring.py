"""Per-token log-probs, entropies and values of training rows, in micro-batches.

All outputs are row layout [B, T], aligned with input_ids: entry t is about token t (its log-prob
given ids[:t], or the value of the state ids[:t] before it), and zero where loss_mask[t] == 0.
Logits are computed only at the positions that predict sampled tokens, and only a chunk of
positions at a time (`learner.chunked_logits`); the critic has no vocabulary head at all.
"""

from __future__ import annotations

import types
from typing import NamedTuple

import torch
from torch import Tensor
from torch.distributed.fsdp import register_fsdp_forward_method

from horizonrl.config import MicroBatchBudget
from horizonrl.learner.chunked_logits import LOGIT_CHUNK_TOKENS, chunked_logp_entropy
from horizonrl.learner.device import autocast, autocast_dtype
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.lora import AdaptersOff, adapters_disabled, lm_body
from horizonrl.learner.shared_prefix import (MIN_SHARED_TOKENS, UNSHARED, NetworkSharing, Plan, Sharing, body_hidden,
                                             in_token_order, plan, shared_with_previous)
from horizonrl.samples.tensors import Rows, pad


SHARDED_LOGPROBS = "horizonrl_token_logprobs"   # the FSDP2 forward method of a sharded policy


def token_logprobs(policy, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                   temperature: float = 1.0, chunk_tokens: int = LOGIT_CHUNK_TOKENS, sharing: Sharing | None = None,
                   micro_batch: Plan | None = None) -> tuple[Tensor, Tensor]:
    """(logp, entropy) of each sampled token under softmax(logits / temperature), the logits of at
    most `chunk_tokens` positions existing at one time (forward and backward). With `sharing`, the body shares
    the rows' prefixes as the micro-batch's Plan says (learner/shared_prefix.body_hidden).

    Assumes logits = lm_head(last hidden state), true of Llama/Qwen/Mistral-family models. A policy
    sharded with FSDP2 computes this in a registered forward method of its root (see
    `register_sharded_logprobs`), so that the root's parameters (embeddings, head) are gathered. The
    reference of a LoRA run (`AdaptersOff`) is its actor with the adapters disabled.
    """
    if isinstance(policy, AdaptersOff):
        with adapters_disabled(policy.actor):
            return token_logprobs(policy.actor, input_ids, attention_mask, loss_mask, temperature, chunk_tokens,
                                  sharing, micro_batch)
    sharded = getattr(policy, SHARDED_LOGPROBS, None)
    if sharded is not None:
        return sharded(input_ids, attention_mask, loss_mask, temperature, chunk_tokens, sharing, micro_batch)
    return _token_logprobs(policy, input_ids, attention_mask, loss_mask, temperature, chunk_tokens, sharing,
                           micro_batch)


def register_sharded_logprobs(policy) -> None:
    """Make `token_logprobs` of the FSDP2-sharded `policy` run as a forward of its root module."""
    setattr(policy, SHARDED_LOGPROBS, types.MethodType(_token_logprobs, policy))
    register_fsdp_forward_method(policy, SHARDED_LOGPROBS)


def _token_logprobs(policy, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, temperature: float,
                    chunk_tokens: int, sharing: Sharing | None, micro_batch: Plan | None) -> tuple[Tensor, Tensor]:
    hidden, targets, predicts = sampled_positions(policy, input_ids, attention_mask, loss_mask, sharing, micro_batch)
    lm_head = policy.get_output_embeddings()
    logp, entropy = chunked_logp_entropy(hidden, lm_head.weight, lm_head.bias, targets, temperature, chunk_tokens,
                                         autocast_dtype(input_ids.device))
    return _scatter(logp, predicts), _scatter(entropy, predicts)


def sampled_positions(policy, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                      sharing: Sharing | None = None, micro_batch: Plan | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(hidden [N, H], targets [N], predicts [B, T-1]): the policy's last hidden states at the N
    positions t-1 that predict sampled tokens t, those tokens' ids, and where the positions are.
    `policy` is a causal LM, plain or PEFT-wrapped (its body runs with the adapters, see lm_body)."""
    with autocast(input_ids.device):
        hidden = body_hidden(lm_body(policy), input_ids, attention_mask, sharing, micro_batch)
    predicts = loss_mask[:, 1:].bool()            # hidden[:, t-1] predicts token t
    return hidden[:, :-1][predicts], input_ids[:, 1:][predicts], predicts


@torch.no_grad()
def response_logprobs(policy, rows: list[tuple[list[int], list[int]]], temperature: float = 1.0,
                      sharing: Sharing | None = None) -> list[list[float]]:
    """The log-prob of each response token of each (prompt ids, response ids) row under `policy`, in one forward
    (no rows: a forward of one token all the same, as every rank of a sharded policy must run one)."""
    device = next(policy.parameters()).device
    sequences = [prompt + response for prompt, response in rows] or [[0]]
    scored = [[0] * len(prompt) + [1] * len(response) for prompt, response in rows] or [[0]]
    loss_mask = pad(scored, 0, torch.long, device)
    logp, _ = token_logprobs(policy, pad(sequences, 0, torch.long, device),
                             pad([[1] * len(s) for s in sequences], 0, torch.long, device), loss_mask, temperature,
                             sharing=sharing)
    return [logp[i][loss_mask[i].bool()].tolist() for i in range(len(rows))]


def token_values(critic, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, sharing: Sharing | None = None,
                 micro_batch: Plan | None = None) -> Tensor:
    """values[:, t] = V(ids[:t]), the value of the state before sampled token t (`sharing`: as token_logprobs)."""
    with autocast(input_ids.device):
        state_values = critic(input_ids, attention_mask, sharing, micro_batch)
    predicts = loss_mask[:, 1:].bool()
    return _scatter(state_values[:, :-1][predicts], predicts)


def _scatter(values: Tensor, predicts: Tensor) -> Tensor:
    out = torch.zeros((predicts.shape[0], predicts.shape[1] + 1), dtype=values.dtype, device=values.device)
    out[:, 1:][predicts] = values
    return out


def pack_rows(lengths: list[int], budget: MicroBatchBudget) -> list[list[int]]:
    """Positions 0..n-1 of `lengths` grouped into micro-batches, each position exactly once.

    Rows budget: consecutive runs of `budget.rows` positions. Token budget: positions sorted longest
    first and packed greedily while len(group) * longest(group) <= budget.tokens, so a micro-batch is
    padded only up to its own longest row; a row longer than the budget is a micro-batch alone.
    """
    if budget.tokens is None:
        return [list(range(begin, min(begin + budget.rows, len(lengths))))
                for begin in range(0, len(lengths), budget.rows)]
    groups: list[list[int]] = []
    for position in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget.tokens:
            groups[-1].append(position)
        else:
            groups.append([position])
    return groups


def pack_shared_rows(tokens: list[list[int]], budget: MicroBatchBudget) -> list[tuple[list[int], Plan]]:
    """Positions 0..n-1 of `tokens` (rows in token order: learner/shared_prefix.in_token_order) in micro-batches
    of consecutive positions, each with the Plan its forward runs (learner/shared_prefix.plan, made here once).

    Rows budget: runs of `budget.rows` positions. Token budget: packed greedily while the estimate of
    `shared_estimate` fits, then every micro-batch whose Plan computes more slots than `budget.tokens` (its
    grouping is not the estimate's one group) is halved until its Plan fits: the budget is a bound. A row longer
    than the budget is a micro-batch alone."""
    def with_plan(group: list[int]) -> tuple[list[int], Plan]:
        return group, plan([tokens[i] for i in group], MIN_SHARED_TOKENS, budget.window)

    if budget.tokens is None:
        return [with_plan(list(range(begin, min(begin + budget.rows, len(tokens)))))
                for begin in range(0, len(tokens), budget.rows)]
    lengths, shared = list(map(len, tokens)), shared_with_previous(tokens)
    greedy: list[list[int]] = []
    for position in range(len(tokens)):
        if greedy and shared_estimate(greedy[-1] + [position], lengths, shared) <= budget.tokens:
            greedy[-1].append(position)
        else:
            greedy.append([position])
    packed, pending = [], [with_plan(group) for group in reversed(greedy)]
    while pending:
        group, micro_batch = pending.pop()
        if micro_batch.slots() <= budget.tokens or len(group) == 1:
            packed.append((group, micro_batch))
        else:
            half = len(group) // 2
            pending += [with_plan(group[half:]), with_plan(group[:half])]
    return packed


def shared_estimate(group: list[int], lengths: list[int], shared: list[int]) -> int:
    """The token slots of consecutive positions `group` as one group whose rows share a prefix P of at least
    MIN_SHARED_TOKENS (the least `shared[i]` of neighbours, shared_with_previous): P + len(group) x
    (longest(group) - P); else len(group) x longest(group)."""
    longest = max(lengths[i] for i in group)
    prefix = min((shared[i] for i in group[1:]), default=0)
    prefix = prefix if prefix >= MIN_SHARED_TOKENS else 0
    return prefix + len(group) * (longest - prefix)


def micro_batches(data: Rows, rows, budget: MicroBatchBudget) -> list[tuple[list[int], Plan]]:
    """`rows` (positions in data's [R, T] tensors) in micro-batches within `budget`, each with the Plan its forward
    runs: pack_rows and the plain pass (a Plan of no sharing), or, with optim.shared_prefix, pack_shared_rows over
    the rows in token order (rows that share a prefix next to each other)."""
    rows = list(rows)
    if not budget.shared_prefix:
        lengths = data.attention_mask[rows].sum(dim=1).tolist()
        return [([rows[i] for i in group], Plan([lengths[i] for i in group], [], min_shared=None))
                for group in pack_rows(lengths, budget)]
    order, tokens = in_token_order(data, rows)
    return [([order[i] for i in group], micro_batch) for group, micro_batch in pack_shared_rows(tokens, budget)]


def padded_groups(groups: list, ranks: Ranks, empty=None) -> list:
    """`groups` followed by `empty` up to the most groups any rank has (see Rows.empty)."""
    return groups + [empty] * (ranks.max(len(groups)) - len(groups))


class Scores(NamedTuple):
    """[R, T] scores of a batch's rows (`score`); None for a network that was not given."""

    logp_old: Tensor | None     # the actor's log-probs
    entropy: Tensor | None      # the actor's entropies
    logp_ref: Tensor | None     # the reference's log-probs
    values_old: Tensor | None   # the critic's values

    def given(self) -> dict[str, Tensor]:
        """The scores of the networks given, by name (the names of Rows' fields)."""
        return {name: value for name, value in self._asdict().items() if value is not None}


@torch.no_grad()
def score(data: Rows, budget: MicroBatchBudget, temperature: float = 1.0, actor=None, reference=None, critic=None,
          ranks: Ranks = LOCAL, sharing: NetworkSharing = UNSHARED) -> Scores:
    """The scores of the networks given: logp_old and entropy (actor), logp_ref (reference), values_old (critic),
    each in the dtype its network gives, each network sharing prefixes as `sharing` says. Every rank runs as many
    forward passes as the rank with the most."""
    out: list[Tensor | None] = [None] * len(Scores._fields)
    for rows, micro_batch in padded_groups(micro_batches(data, range(len(data)), budget), ranks, (None, None)):
        mb = data.select(rows) if rows is not None else data.empty()
        args = (mb.input_ids, mb.attention_mask, mb.loss_mask)
        logp, entropy = (None, None) if actor is None else \
            token_logprobs(actor, *args, temperature, sharing=sharing.actor, micro_batch=micro_batch)
        logp_ref = None if reference is None else \
            token_logprobs(reference, *args, temperature, sharing=sharing.reference, micro_batch=micro_batch)[0]
        values = None if critic is None else token_values(critic, *args, sharing.critic, micro_batch)
        if rows is None:                        # an empty micro-batch: its passes only join the other ranks'
            continue
        for k, value in enumerate((logp, entropy, logp_ref, values)):
            if value is not None:
                if out[k] is None:
                    out[k] = torch.zeros(data.input_ids.shape, dtype=value.dtype, device=value.device)
                out[k][rows, :value.shape[1]] = value
    return Scores(*out)


@torch.no_grad()
def prompt_values(critic, prompts: list[list[int]], pad_id: int, budget: MicroBatchBudget, device,
                  ranks: Ranks = LOCAL, sharing: Sharing | None = None) -> Tensor:
    """V(prompt) for each prompt: the critic's value at its last token (the bootstrap V(s_{T+1})), the critic
    sharing prefixes with `sharing`, each micro-batch planned from its rows. Every rank runs as many forward passes
    as the rank with the most."""
    out = torch.zeros(len(prompts), device=device)
    for group in padded_groups(pack_rows([len(p) for p in prompts], budget), ranks):
        chunk = [prompts[i] for i in group] if group is not None else [[pad_id]]
        input_ids = pad(chunk, pad_id, torch.long, device)
        attention_mask = pad([[1] * len(p) for p in chunk], 0, torch.long, device)
        with autocast(input_ids.device):
            state_values = critic(input_ids, attention_mask, sharing)
        if group is not None:
            last = attention_mask.sum(dim=1) - 1
            out[group] = state_values[torch.arange(len(chunk), device=device), last]
    return out
