"""Grammar-constrained sampling in the hf engine: a random tiny model, which never writes valid JSON on its
own, writes schema-valid JSON and well-formed tool calls every time under a grammar, and its log-probs are
those of the masked, renormalised distribution (recomputed here with a plain forward pass and a matcher of
the grammar's own).

The tokenizer is trained on the river env's text and on JSON values and tool calls, as a real tokenizer
has merges for JSON (`", "`, `": `...): with the river text alone, closing a string is a ~1/1000 draw for
a random model and a response takes thousands of tokens."""

import asyncio
import json
import random

import pytest
import torch
import xgrammar as xgr

from horizonrl import envs
from horizonrl.config import TinyModel
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.grammar import json_grammar, tool_call_grammar
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.models import stop_ids
from horizonrl.tools.calls import ToolCall, parse_tool_calls
from horizonrl.assembly.warm_start import build_tiny, env_corpus

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {
            "type": "object", "properties": {"label": {"type": "string"}, "weight": {"type": "integer"}},
            "required": ["label"], "additionalProperties": False}},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"direction": {"enum": ["left", "right"]}, "steps": {"type": "integer"}},
        "required": ["direction", "steps"]}}},
    {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
]
WORDS = ["stone", "river", "bank", "jump", "left", "right", "swim", "red", "blue", "the"]


def corpus(seed: int = 0) -> list[str]:
    """River text, JSON values of SCHEMA's shape and tool-call blocks, as json.dumps writes them."""
    rng = random.Random(seed)

    def words() -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(1, 3)))

    values = [{"name": words(), "age": rng.randint(-50, 500), "color": rng.choice(["red", "green", "blue"]),
               "tags": [{"label": words(), "weight": rng.randint(-9, 99)} for _ in range(rng.randint(0, 2))]}
              for _ in range(400)]
    calls = [{"name": "move", "arguments": {"direction": rng.choice(["left", "right"]), "steps": rng.randint(1, 9)}}
             for _ in range(100)] + [{"name": "note", "arguments": {"text": words()}} for _ in range(100)]
    return (env_corpus(envs.make("river")) + [json.dumps(v) for v in values]
            + [f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls])


def build_json_tiny(**sizes):
    """(tokenizer, random tiny model) for `corpus()`; `sizes` override TinyModel's."""
    tokenizer, model = build_tiny(corpus(), TinyModel(**sizes), seed=0, device=torch.device("cpu"))
    return tokenizer, model.eval()


@pytest.fixture(scope="module")
def json_tiny():
    return build_json_tiny()


def conforms(value, schema: dict) -> bool:
    """Whether `value` matches `schema` (the keywords SCHEMA and TOOLS use), checked by hand."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "object":
        properties = schema.get("properties", {})
        return (isinstance(value, dict) and set(schema.get("required", [])) <= set(value) <= set(properties)
                and all(conforms(value[key], properties[key]) for key in value))
    if kind == "array":
        return isinstance(value, list) and all(conforms(item, schema["items"]) for item in value)
    types = {"string": str, "integer": int}
    return isinstance(value, types[kind]) and not isinstance(value, bool)


def generate_all(engine, prompts, params):
    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return asyncio.run(run())


def prompts_of(tokenizer, n: int) -> list[list[int]]:
    return [tokenizer.encode(f"You are on stone {i % 5} of 5. The next stone is to your right.") for i in range(n)]


def allowed_tokens(tokenizer, vocab_size: int, grammar: str, response: list[int], stops: tuple[int, ...],
                   specials_allowed: bool = False) -> list[torch.Tensor]:
    """Before each token of `response`: which ids a fresh xgrammar matcher of `grammar` allows, special
    tokens other than `stops` left out (unless `specials_allowed`, as vLLM's backend has them)."""
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(grammar), override_stop_tokens=list(stops))
    bitmask, masks = xgr.allocate_token_bitmask(1, vocab_size), []
    for token in response:
        matcher.fill_next_token_bitmask(bitmask)
        scores = torch.zeros(1, vocab_size)
        xgr.apply_token_bitmask_inplace(scores, bitmask)
        allowed = scores[0] == 0
        if not specials_allowed:
            allowed[[i for i in tokenizer.all_special_ids if i not in stops]] = False
        masks.append(allowed)
        assert matcher.accept_token(token)
    return masks


def masked_logprobs(model, tokenizer, prompt, response, grammar, stops, temperature=1.0, top_p=1.0,
                    specials_allowed=False) -> tuple[torch.Tensor, torch.Tensor]:
    """(constrained, unconstrained) log-probs of `response`'s tokens: one forward pass over prompt and response,
    then at each response position log_softmax(masked logits / T) restricted to the top-p nucleus and
    renormalised (T = 0: untempered); unconstrained: log_softmax(logits / T)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    scale = temperature if temperature > 0 else 1.0
    constrained, unconstrained = [], []
    masks = allowed_tokens(tokenizer, logits.shape[-1], grammar, response, stops, specials_allowed)
    for row, token, allowed in zip(logits / scale, response, masks):
        log_probs = row.masked_fill(~allowed, float("-inf")).log_softmax(-1)
        if top_p < 1:
            order = log_probs.argsort(descending=True)
            mass = log_probs[order].exp().cumsum(0)
            kept = order[:int((mass < top_p).sum()) + 1]
            log_probs = torch.full_like(log_probs, float("-inf")).index_copy(0, kept, log_probs[kept]).log_softmax(-1)
        constrained.append(log_probs[token])
        unconstrained.append(row.log_softmax(-1)[token])
    return torch.stack(constrained), torch.stack(unconstrained)


def decoded(tokenizer, generation) -> str:
    return tokenizer.decode(generation.token_ids, skip_special_tokens=True)


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_json_schema_responses_all_parse_and_match_the_schema(json_tiny):
    tokenizer, model = json_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer, seed=0)
    stops = stop_ids(tokenizer, model)
    constrained = SamplingParams(max_tokens=400, stop_ids=stops, grammar=json_grammar(SCHEMA))
    free = SamplingParams(max_tokens=64, stop_ids=stops)
    prompts = prompts_of(tokenizer, 64)

    async def run():   # constrained and unconstrained rows decode in the same batches
        return await asyncio.gather(*(engine.generate(p, constrained) for p in prompts),
                                    *(engine.generate(p, free) for p in prompts))
    generations = asyncio.run(run())
    ours, theirs = generations[:64], generations[64:]
    assert all(g.finish_reason == "stop" and g.token_ids[-1] in stops for g in ours)
    texts = [decoded(tokenizer, g) for g in ours]
    values = [json.loads(text) for text in texts]
    assert all(conforms(value, SCHEMA) for value in values)
    assert all(json.dumps(value, ensure_ascii=False) == text for value, text in zip(values, texts))  # no floats here
    assert sum(v["tags"] != [] for v in values) >= 8     # the nested array is exercised, not always empty
    valid = sum(is_json(decoded(tokenizer, g)) for g in theirs) / len(theirs)
    print(f"unconstrained responses that parse as JSON: {valid:.0%}; constrained: 100%")
    assert valid == 0


@pytest.mark.parametrize("name", [None, "note"])
def test_tool_call_responses_are_one_well_formed_call(json_tiny, name):
    tokenizer, model = json_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer, seed=1)
    stops = stop_ids(tokenizer, model)
    params = SamplingParams(max_tokens=400, stop_ids=stops, grammar=tool_call_grammar(TOOLS, name))
    generations = generate_all(engine, prompts_of(tokenizer, 64), params)
    assert all(g.finish_reason == "stop" for g in generations)
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    names = set()
    for g in generations:
        text = decoded(tokenizer, g)
        (call,) = parse_tool_calls(text)
        assert isinstance(call, ToolCall) and conforms(call.arguments, schemas[call.name])
        names.add(call.name)
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}
        rendered = tokenizer.apply_chat_template([message], tools=TOOLS, tokenize=False)
        assert rendered.endswith(f"<|im_start|>assistant\n{text}<|im_end|>\n")   # the template writes it back
    assert names == ({"move", "note"} if name is None else {name})


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_are_those_of_the_masked_distribution(json_tiny, temperature, top_p):
    tokenizer, model = json_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer, seed=2)
    stops = stop_ids(tokenizer, model)
    grammar = json_grammar(SCHEMA)
    prompt = prompts_of(tokenizer, 1)[0]
    params = SamplingParams(max_tokens=400, temperature=temperature, top_p=top_p, stop_ids=stops, grammar=grammar)
    (g,) = generate_all(engine, [prompt], params)
    assert len(g.token_ids) >= 3
    expected, unconstrained = masked_logprobs(model, tokenizer, prompt, g.token_ids, grammar, stops, temperature, top_p)
    assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0), (g.logprobs, expected)
    if top_p == 1.0:
        assert (torch.tensor(g.logprobs) >= unconstrained - 1e-5).all()
        assert (torch.tensor(g.logprobs) > unconstrained + 1e-3).any()   # the mask removed mass somewhere


def test_a_grammar_needs_stop_ids_and_must_compile(json_tiny):
    tokenizer, model = json_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer)
    prompt = prompts_of(tokenizer, 1)[0]
    with pytest.raises(ValueError, match="a grammar needs stop_ids"):
        generate_all(engine, [prompt], SamplingParams(grammar=json_grammar(None)))
    with pytest.raises(ValueError, match="the grammar does not compile"):
        generate_all(engine, [prompt], SamplingParams(stop_ids=(tokenizer.eos_token_id,), grammar="root ::= nowhere"))
