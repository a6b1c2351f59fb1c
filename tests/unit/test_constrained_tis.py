"""Constrained responses in the learner: the engine's log-probs are those of the grammar's masked distribution,
the learner scores without the grammar, and the difference is measured and corrected by TIS.

At a step whose grammar allows the tokens A, with Z = sum over a in A of softmax(logits)_a (the mass the mask
keeps), the engine's log-prob of the sampled token is logp_old - log Z, so
    rollout/logprob_abs_diff = mean |logp_old - logp_engine| = mean |log Z| = mean -log Z > 0,
    TIS weight = min(exp(logp_old - logp_engine), cap) = min(Z, cap) = Z (Z <= 1 <= cap):
a constrained token weighs in the policy gradient by the probability that the unconstrained policy stays in
the grammar there (the learner does not score under the constraint)."""

import asyncio

import torch

from horizonrl.algos.losses import tis_weights
from horizonrl.engines import constrained
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.grammar import json_grammar
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.models import stop_ids
from horizonrl.learner.scoring import token_logprobs
from horizonrl.learner.update import actor_loss_fn
from horizonrl.samples.tensors import Rows

GRAMMAR = json_grammar({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                        "required": ["name", "age"]})


def test_the_masks_renormalisation_is_measured_and_weighted_by_tis(river_tiny):
    tokenizer, model = river_tiny
    stops = stop_ids(tokenizer, model)
    prompt = tokenizer.encode("You are on stone 1 of 5. The next stone is to your right.")
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer, seed=0)
    generation = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=12, stop_ids=stops, grammar=GRAMMAR)))
    response = generation.token_ids
    n = len(response)

    # Z at each step, by hand: the unconstrained probability of the tokens the grammar allows there
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    matcher = constrained.matcher(tokenizer, engine.vocab_size, GRAMMAR, stops)
    kept = []
    for row, token in zip(logits, response):
        masked = row.clone()[None]
        constrained.mask_logits(masked, [0], [matcher])
        kept.append(row.softmax(-1)[masked[0] > float("-inf")].sum())
        constrained.advance(matcher, token)
    z = torch.stack(kept)
    assert (z <= 1).all() and (z < 0.99).any()

    input_ids = torch.tensor([prompt + response])
    loss_mask = torch.tensor([[0.0] * len(prompt) + [1.0] * n])
    logp_engine = torch.zeros_like(loss_mask)
    logp_engine[0, len(prompt):] = torch.tensor(generation.logprobs)
    mb = Rows(input_ids, torch.ones_like(input_ids), loss_mask, advantages=torch.ones_like(loss_mask),
              logp_engine=logp_engine)
    _, parts = actor_loss_fn(model, 0.2, 0.2, None, 0.0, "token-mean", 1.0, tis_cap=2.0)(mb, float(n), 1.0)

    total, count = parts["rollout/logprob_abs_diff"]
    assert count == n
    assert total / count > 0.01
    assert abs(total / count - float(-z.log().mean())) < 1e-4
    with torch.no_grad():
        logp_old, _ = token_logprobs(model, input_ids, mb.attention_mask, loss_mask)
    weights = tis_weights(logp_old, logp_engine, 2.0)[0, len(prompt):]
    assert torch.allclose(weights, z, atol=1e-5, rtol=0)
    total, count = parts["rollout/tis_weight_mean"]
    assert abs(total / count - float(z.mean())) < 1e-5
    assert parts["rollout/tis_clipped_frac"][0] == 0
