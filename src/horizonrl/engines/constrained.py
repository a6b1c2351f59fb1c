"""Grammar-constrained sampling in the hf engine, with xgrammar.

A request with `SamplingParams.grammar` gets a matcher of its grammar (engines/grammar.py's EBNF). Before
each of its tokens is sampled, the logits of every token that would leave the language are set to -inf,
and so are its stop ids until the response is complete (then, if the language goes no further, only they
are left); the sampled token then advances the matcher. The sampling distribution is softmax of the masked
logits (then temperature and top-p), and the engine's log-probs are those of that masked, renormalised
distribution: log p(t) = l_t / T - log sum over allowed t' of exp(l_t' / T) (T = 1 for greedy requests;
top-p then restricts and renormalises that). Special tokens other than the request's stop ids are never
allowed (decoded without special tokens they would vanish from the text the grammar matched; vLLM's
xgrammar backend lets them spell their text inside a JSON string).

The learner scores responses without the grammar: its log-prob of a constrained token is lower by -log Z,
Z the unconstrained probability of the tokens the grammar allowed there. `rollout/logprob_abs_diff`
measures that, and with `actor.tis_cap` each such token's weight is exp(logp_old - logp_engine) = Z
(tests/unit/test_constrained_tis.py): the policy gradient is taken for the unconstrained policy, weighted
by how likely it was to stay in the grammar.

Why xgrammar (benchmarks/constrained_decoding.py on a 2-core CPU; a schema with a string, an integer, an
enum and a nested array): on Qwen2.5's 151,936-id head it compiles the schema in 17-20 ms (the EBNF of
engines/grammar.py or xgrammar's own converter) and fills a step's mask in 9-15 us mean, 23-41 us p95,
beside 0.3-0.5 ms to apply any library's mask to the logits row; outlines-core takes 0.4-0.8 s per new
schema and 120-190 us a step; lm-format-enforcer 3.5-5 s of tokenizer preprocessing and 16-20 ms a step
(and its transformers integration does not import under transformers 5). On the tiny tests' 1k-id
tokenizer all but lm-format-enforcer take ~2 ms and ~1 us. xgrammar is also vLLM's default backend, so the
hf and vLLM engines compile the same EBNF. A tool-call grammar compiles slower (~0.4 s on Qwen2.5: its
strings exclude the tool-call tags, engines/grammar.py), once per tool list.

Compiled grammars are cached, least recently used first out, by (tokenizer, head size, grammar).
"""

from __future__ import annotations

import functools

import torch
import xgrammar as xgr

COMPILED_GRAMMARS = 256
"""How many compiled grammars are kept (per-request tool lists and response formats repeat across turns)."""


@functools.lru_cache(maxsize=4)
def _compiler(tokenizer, vocab_size: int) -> xgr.GrammarCompiler:
    """A compiler for `tokenizer`'s ids in a `vocab_size`-wide head, its special tokens spelling nothing
    (so never allowed, except as a matcher's stop tokens)."""
    decoded = list(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size).decoded_vocab)
    for special in tokenizer.all_special_ids:
        decoded[special] = b""
    info = xgr.TokenizerInfo(decoded, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=[tokenizer.eos_token_id])
    return xgr.GrammarCompiler(info, cache_enabled=False)


@functools.lru_cache(maxsize=COMPILED_GRAMMARS)
def compiled_grammar(tokenizer, vocab_size: int, grammar: str) -> xgr.CompiledGrammar:
    """`grammar` compiled for `tokenizer` (ValueError naming the problem when it does not compile)."""
    try:
        return _compiler(tokenizer, vocab_size).compile_grammar(grammar)
    except RuntimeError as error:
        raise ValueError(f"the grammar does not compile: {error}") from None


def matcher(tokenizer, vocab_size: int, grammar: str, stop_ids: tuple[int, ...]) -> xgr.GrammarMatcher:
    """A matcher at the start of `grammar`, whose complete responses end with one of `stop_ids`."""
    return xgr.GrammarMatcher(compiled_grammar(tokenizer, vocab_size, grammar), override_stop_tokens=list(stop_ids))


def mask_logits(logits: torch.Tensor, rows: list[int], matchers: list[xgr.GrammarMatcher]) -> None:
    """Set to -inf, in place, the logits of the tokens that matchers[i] does not allow next in row rows[i]
    of `logits` [B, vocab]; the other rows are left as they are."""
    bitmask = xgr.allocate_token_bitmask(len(rows), logits.shape[-1])
    for i, constrained in enumerate(matchers):
        constrained.fill_next_token_bitmask(bitmask, i)
    index = torch.tensor(rows, device=logits.device)
    masked = logits.index_select(0, index)
    xgr.apply_token_bitmask_inplace(masked, bitmask.to(logits.device))
    logits.index_copy_(0, index, masked)


def advance(constrained: xgr.GrammarMatcher, token: int) -> None:
    """Move `constrained` past `token`, which its mask allowed."""
    if not constrained.accept_token(token):
        raise RuntimeError(f"the grammar matcher refused token {token}, which its own mask allowed")
