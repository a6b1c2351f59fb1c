"""Per-token log-probs, entropies and values of training rows, in micro-batches.

All outputs are row layout [B, T], aligned with input_ids: entry t is about token t (its log-prob
given ids[:t], or the value of the state ids[:t] before it), and zero where loss_mask[t] == 0.
Logits are computed only at the positions that predict sampled tokens, and only a chunk of
positions at a time (`learner.chunked_logits`); the critic has no vocabulary head at all.
"""

from __future__ import annotations

import torch
from torch import Tensor

from horizonrl.config import MicroBatchBudget
from horizonrl.learner.chunked_logits import LOGIT_CHUNK_TOKENS, chunked_logp_entropy
from horizonrl.learner.device import autocast, autocast_dtype
from horizonrl.samples.tensors import pad


def token_logprobs(policy, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                   temperature: float = 1.0, chunk_tokens: int = LOGIT_CHUNK_TOKENS) -> tuple[Tensor, Tensor]:
    """(logp, entropy) of each sampled token under softmax(logits / temperature), the logits of at
    most `chunk_tokens` positions existing at one time (forward and backward).

    Assumes logits = lm_head(last hidden state), true of Llama/Qwen/Mistral-family models.
    """
    hidden, targets, predicts = sampled_positions(policy, input_ids, attention_mask, loss_mask)
    lm_head = policy.get_output_embeddings()
    logp, entropy = chunked_logp_entropy(hidden, lm_head.weight, lm_head.bias, targets, temperature, chunk_tokens,
                                         autocast_dtype(input_ids.device))
    return _scatter(logp, predicts), _scatter(entropy, predicts)


def sampled_positions(policy, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """(hidden [N, H], targets [N], predicts [B, T-1]): the policy's last hidden states at the N
    positions t-1 that predict sampled tokens t, those tokens' ids, and where the positions are."""
    with autocast(input_ids.device):
        hidden = policy.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    predicts = loss_mask[:, 1:].bool()            # hidden[:, t-1] predicts token t
    return hidden[:, :-1][predicts], input_ids[:, 1:][predicts], predicts


def token_values(critic, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> Tensor:
    """values[:, t] = V(ids[:t]), the value of the state before sampled token t."""
    with autocast(input_ids.device):
        state_values = critic(input_ids, attention_mask)
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


def select_rows(data: dict[str, Tensor], rows: list[int]) -> dict[str, Tensor]:
    """`rows` of every tensor, trimmed to the longest of them (rows are right-padded)."""
    index = torch.tensor(rows, device=data["input_ids"].device)
    width = int(data["attention_mask"][index].sum(dim=1).max())
    return {key: value[index, :width] for key, value in data.items()}


def micro_batches(data: dict[str, Tensor], rows: list[int], budget: MicroBatchBudget):
    """`rows` packed into micro-batches within `budget` (see pack_rows), each trimmed to its longest row."""
    lengths = data["attention_mask"][rows].sum(dim=1).tolist()
    for group in pack_rows(lengths, budget):
        yield select_rows(data, [rows[i] for i in group])


@torch.no_grad()
def score(data: dict[str, Tensor], budget: MicroBatchBudget, temperature: float = 1.0, actor=None,
          reference=None, critic=None) -> dict[str, Tensor]:
    """[R, T] tensors from the networks given: logp_old and entropy (actor), logp_ref (reference),
    values_old (critic)."""
    out: dict[str, Tensor] = {}

    def keep(key: str, rows: list[int], value: Tensor) -> None:
        if key not in out:
            out[key] = torch.zeros(data["input_ids"].shape, dtype=value.dtype, device=value.device)
        out[key][rows, :value.shape[1]] = value

    for rows in pack_rows(data["attention_mask"].sum(dim=1).tolist(), budget):
        mb = select_rows(data, rows)
        args = (mb["input_ids"], mb["attention_mask"], mb["loss_mask"])
        if actor is not None:
            logp, entropy = token_logprobs(actor, *args, temperature=temperature)
            keep("logp_old", rows, logp)
            keep("entropy", rows, entropy)
        if reference is not None:
            keep("logp_ref", rows, token_logprobs(reference, *args, temperature=temperature)[0])
        if critic is not None:
            keep("values_old", rows, token_values(critic, *args))
    return out


@torch.no_grad()
def prompt_values(critic, prompts: list[list[int]], pad_id: int, budget: MicroBatchBudget, device) -> Tensor:
    """V(prompt) for each prompt: the critic's value at its last token (the bootstrap V(s_{T+1}))."""
    out = torch.zeros(len(prompts), device=device)
    for group in pack_rows([len(p) for p in prompts], budget):
        chunk = [prompts[i] for i in group]
        input_ids = pad(chunk, pad_id, torch.long, device)
        attention_mask = pad([[1] * len(p) for p in chunk], 0, torch.long, device)
        with autocast(input_ids.device):
            state_values = critic(input_ids, attention_mask)
        last = attention_mask.sum(dim=1) - 1
        out[group] = state_values[torch.arange(len(chunk), device=device), last]
    return out
