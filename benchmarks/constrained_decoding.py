"""Constrained-decoding libraries on this machine's CPU, for one JSON schema; prints one JSON object.

    OMP_NUM_THREADS=1 python benchmarks/constrained_decoding.py [--responses 8] [--repeats 3]

Libraries: xgrammar (its own JSON-schema converter, and the EBNF of horizonrl.engines.grammar that the
engines compile), outlines-core (schema -> regex -> token index) and lm-format-enforcer (a character-level
parser walked over a token prefix tree). Schema: an object with a string, an integer, an enum and a
nested array of objects. Tokenizers: the tiny tests' BPE (trained on the river env, ~1k ids) and
Qwen2.5's (151,665 ids in a 151,936-row head; tests/qwen25_tokenizer.py builds it offline). Measured per
library and tokenizer:
- setup_s: the per-tokenizer preprocessing (xgrammar TokenizerInfo, outlines Vocabulary, LMFE's
  tokenizer data), once per engine;
- compile_s: median of `repeats` cold compiles of the schema (no compiler cache);
- mask_us mean and p95: per decoding step, filling the 32-bit bitmask of the allowed next tokens (the
  layout all three write); over the tokens of `responses` valid values as json.dumps writes them (a fresh
  matcher per response, advanced by each token, which is checked to be allowed);
- apply_us (per tokenizer, the same for every library): xgrammar's CPU kernel setting the masked entries
  of one [1, vocab] float32 logits row to -inf.
`install` says how each installed next to torch 2.13 (CPU) and transformers 5; `vllm_default` what vLLM
picks when a request does not name a backend.

Decision (engines/constrained.py): xgrammar. On Qwen2.5 it compiles the schema in ~20 ms and fills a
step's mask in ~10-15 us (mean), far below a decode step; outlines-core needs ~0.4 s to index its regex
against the 151k vocabulary per new schema (every new tool list or response format is one) and ~0.1 ms a
step, and lm-format-enforcer seconds of tokenizer preprocessing and ~20 ms a step in Python. xgrammar is
also vLLM's default backend, so the hf and vLLM engines read the same EBNF. Its cost: on x86-64 Linux it
pulls triton (a 286 MB wheel).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import transformers
import xgrammar as xgr

from horizonrl.engines.grammar import json_grammar

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {
            "type": "object", "properties": {"label": {"type": "string"}, "weight": {"type": "integer"}},
            "required": ["label", "weight"], "additionalProperties": False}},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
NAMES = ["Ada Lovelace", "Grace Hopper", "Alan Turing", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth",
         "Frances Allen", "John McCarthy"]
COLORS = ["red", "green", "blue"]


def values(n: int) -> list[dict]:
    return [{"name": NAMES[i % len(NAMES)], "age": 30 + 7 * i, "color": COLORS[i % 3],
             "tags": [{"label": f"topic number {j} of {NAMES[i % len(NAMES)]}", "weight": j * 11 - 5}
                      for j in range(1 + i % 3)]} for i in range(n)]


def tokenizers() -> dict:
    from qwen25_tokenizer import build_qwen_tokenizer

    from horizonrl import envs
    from horizonrl.config import TinyModel
    from horizonrl.assembly.warm_start import build_tiny_for_envs

    tiny, _ = build_tiny_for_envs([envs.make("river")], TinyModel(), seed=0, device=torch.device("cpu"))
    return {"tiny": (tiny, len(tiny)), "qwen2.5": (build_qwen_tokenizer(), 151936)}


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


class XGrammar:
    """`ebnf`: compile horizonrl's EBNF of the schema; else xgrammar's own schema converter."""

    def __init__(self, tokenizer, vocab_size: int, ebnf: bool):
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=[tokenizer.eos_token_id])
        self.ebnf = ebnf

    def compile(self):
        compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)
        if self.ebnf:
            return compiler.compile_grammar(json_grammar(SCHEMA))
        return compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))

    def start(self, compiled):
        return xgr.GrammarMatcher(compiled)

    def mask(self, matcher, bitmask, sequence):
        matcher.fill_next_token_bitmask(bitmask)

    def advance(self, matcher, token, sequence) -> bool:
        return matcher.accept_token(token)


class Outlines:
    def __init__(self, tokenizer, vocab_size: int):
        import outlines_core

        self.oc, self.eos = outlines_core, tokenizer.eos_token_id
        self.vocabulary = outlines_core.Vocabulary(self.eos, byte_vocabulary(tokenizer))

    def compile(self):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA), whitespace_pattern="[ ]?")
        return self.oc.Index(regex, self.vocabulary)

    def start(self, compiled):
        return self.oc.Guide(compiled)

    def mask(self, guide, bitmask, sequence):
        guide.write_mask_into(bitmask.data_ptr(), bitmask.numel(), bitmask.element_size())

    def advance(self, guide, token, sequence) -> bool:
        if token == self.eos:
            return guide.is_finished()
        guide.advance(token)
        return True


class FormatEnforcer:
    def __init__(self, tokenizer, vocab_size: int):
        # lm-format-enforcer 0.11 imports transformers.tokenization_utils, which transformers 5 removed
        shim = types.ModuleType("transformers.tokenization_utils")
        shim.PreTrainedTokenizerBase = transformers.PreTrainedTokenizerBase
        sys.modules.setdefault("transformers.tokenization_utils", shim)
        import lmformatenforcer
        from lmformatenforcer.integrations.transformers import build_token_enforcer_tokenizer_data

        self.lmfe = lmformatenforcer
        self.data = build_token_enforcer_tokenizer_data(tokenizer, use_bitmask=True, vocab_size=vocab_size)

    def compile(self):
        return self.lmfe.JsonSchemaParser(SCHEMA)

    def start(self, compiled):
        return self.lmfe.TokenEnforcer(self.data, compiled)

    def mask(self, enforcer, bitmask, sequence):
        bitmask[0] = enforcer.get_allowed_tokens(sequence).allowed_tokens

    def advance(self, enforcer, token, sequence) -> bool:
        return bool(enforcer.get_allowed_tokens(sequence).is_token_allowed(token))


def byte_vocabulary(tokenizer) -> dict[bytes, list[int]]:
    """Token bytes -> ids for a byte-level BPE (as vLLM builds outlines' vocabulary), special tokens left out."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_tokens)
    vocabulary: dict[bytes, list[int]] = {}
    for token, index in tokenizer.get_vocab().items():
        if token in special:
            continue
        text = bytes(to_byte[c] for c in token) if all(c in to_byte for c in token) else token.encode()
        vocabulary.setdefault(text, []).append(index)
    return vocabulary


def measure(library, tokenizer, vocab_size: int, responses: int, repeats: int) -> dict:
    compiled, compile_times = None, []
    for _ in range(repeats):
        compiled, seconds = timed(library.compile)
        compile_times.append(seconds)
    step_us = []
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    for value in values(responses):
        ids = tokenizer.encode(json.dumps(value), add_special_tokens=False) + [tokenizer.eos_token_id]
        state, sequence = library.start(compiled), [tokenizer.eos_token_id]   # LMFE keys its states by prefix
        for token in ids:
            start = time.perf_counter()
            library.mask(state, bitmask, sequence)
            step_us.append((time.perf_counter() - start) * 1e6)
            if not (int(bitmask[0, token // 32]) >> (token % 32)) & 1:
                raise AssertionError(f"{type(library).__name__} masks token {token} of a valid response")
            if not library.advance(state, token, sequence):
                raise AssertionError(f"{type(library).__name__} rejects token {token} of a valid response")
            sequence = sequence + [token]
    step_us.sort()
    return {"compile_s": round(statistics.median(compile_times), 4), "mask_us_mean": round(statistics.mean(step_us), 1),
            "mask_us_p95": round(step_us[int(0.95 * (len(step_us) - 1))], 1), "steps": len(step_us)}


def apply_us(vocab_size: int, repeats: int = 200) -> float:
    """Mean microseconds of xgrammar's CPU kernel setting the masked entries of one logits row to -inf."""
    bitmask, logits = xgr.allocate_token_bitmask(1, vocab_size), torch.randn(1, vocab_size)
    bitmask[:, ::3] = 0
    start = time.perf_counter()
    for _ in range(repeats):
        xgr.apply_token_bitmask_inplace(logits, bitmask)
    return round((time.perf_counter() - start) / repeats * 1e6, 1)


def vllm_default() -> str:
    try:
        from vllm.config import StructuredOutputsConfig
    except ImportError:
        return ("vLLM not importable here; in vLLM 0.32 StructuredOutputsConfig.backend is 'auto', which validates "
                "each request with xgrammar first (guidance, then outlines, only for what xgrammar rejects)")
    return f"StructuredOutputsConfig().backend = {StructuredOutputsConfig().backend!r} (auto tries xgrammar first)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--responses", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    libraries = {"xgrammar (json schema)": lambda t, v: XGrammar(t, v, ebnf=False),
                 "xgrammar (horizonrl EBNF)": lambda t, v: XGrammar(t, v, ebnf=True),
                 "outlines-core": Outlines, "lm-format-enforcer": FormatEnforcer}
    results, apply = {}, {}
    for tokenizer_name, (tokenizer, vocab_size) in tokenizers().items():
        apply[tokenizer_name] = apply_us(vocab_size)
        for name, build in libraries.items():
            library, setup_s = timed(functools.partial(build, tokenizer, vocab_size))
            row = measure(library, tokenizer, vocab_size, args.responses, args.repeats)
            results.setdefault(name, {})[tokenizer_name] = row = {"setup_s": round(setup_s, 3), **row}
            print(name, tokenizer_name, row, file=sys.stderr)
    print(json.dumps({
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__},
        "schema": SCHEMA,
        "results": results,
        "apply_us": apply,
        "install": {
            "xgrammar": "clean with torch 2.13 CPU; pulls apache-tvm-ffi and, on x86-64 Linux, triton (a 286 MB "
                        "wheel)",
            "outlines-core": "clean; no dependencies (a 2.3 MB wheel)",
            "lm-format-enforcer": "installs, but its transformers integration fails to import under transformers 5 "
                                  "(transformers.tokenization_utils is gone; shimmed here)",
        },
        "vllm_default": vllm_default(),
    }, indent=1))


if __name__ == "__main__":
    main()
