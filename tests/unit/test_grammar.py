"""The grammars of engines/grammar.py, matched by xgrammar on the Qwen2.5 tokenizer: JSON values exactly as
json.dumps writes them (and nothing else), and tool calls exactly as the chat template writes them."""

import json
import math
import random

import pytest
import xgrammar as xgr

from horizonrl.engines.grammar import call_or_json_grammar, json_grammar, tool_call_grammar

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue", None, 3]},
        "kind": {"const": "person"},
        "note": {"type": ["string", "null"]},
        "either": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]},
        "tags": {"type": "array", "items": {
            "type": "object", "properties": {"label": {"type": "string"}, "weight": {"type": "integer"}},
            "required": ["label"], "additionalProperties": False}},
        "extra": {},
    },
    "required": ["name", "age", "score", "ok", "color", "kind", "note", "either", "tags", "extra"],
    "additionalProperties": False,
}
VALID = [
    {"name": "Ada", "age": 36, "score": 1.5, "ok": True, "color": "red", "kind": "person", "note": None,
     "either": 7, "tags": [{"label": "x", "weight": -3}, {"label": "y"}], "extra": {"any": [1, "two", None]}},
    {"name": 'quote " backslash \\ newline \n tab \t bell \x07 del \x7f slash / é 漢 🙂', "age": -12, "score": 0,
     "ok": False, "color": None, "kind": "person", "note": "n", "either": ["a", "b"], "tags": [], "extra": 1e-05},
    {"name": "", "age": 0, "score": -0.0, "ok": True, "color": 3, "kind": "person", "note": "",
     "either": [], "tags": [{"label": ""}], "extra": "x"},
]
TOOLS = [
    {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"direction": {"enum": ["left", "right"]}, "steps": {"type": "integer"}},
        "required": ["direction"]}}},
    {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
    {"type": "function", "function": {"name": "now"}},
]
HEAD = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def compiler(qwen_tokenizer):
    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(qwen_tokenizer, vocab_size=151936))


def accepts(compiler, grammar: str, text: str) -> bool:
    """Whether `text` is a whole sentence of `grammar`."""
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
    return matcher.accept_string(text) and matcher.is_completed()


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def rendered_call(tokenizer, name: str, arguments: dict) -> str:
    """The text Qwen2.5's chat template writes for an assistant message that is one call."""
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}
    text = tokenizer.apply_chat_template([{"role": "user", "content": "go"}, message], tools=TOOLS, tokenize=False)
    return text[text.rindex(HEAD) + len(HEAD):].removesuffix("<|im_end|>\n")


def test_values_are_accepted_as_json_dumps_writes_them(compiler):
    grammar = json_grammar(SCHEMA)
    for value in VALID:
        assert accepts(compiler, grammar, dumps(value)), dumps(value)


@pytest.mark.parametrize("old, new", [
    ("null]}}", "null]}} "),                                        # trailing whitespace
    ('"name": ', '"name":'),                                        # ":" without its space
    ('"Ada", ', '"Ada",'),                                          # "," without its space
    ('{"name"', '{\n  "name"'),                                     # indented
    ('"name": "Ada", "age": 36', '"age": 36, "name": "Ada"'),       # properties out of schema order
    ('"age": 36, ', ""),                                            # a required property missing
    ("null]}}", 'null]}, "more": 1}'),                              # a property the schema has not
    ("36", "36.0"),                                                 # a float for an integer
    ("36", "036"),                                                  # a leading zero
    ("36", "-0"),                                                   # -0 (json.dumps writes 0)
    ("1.5", "1.50"),                                                # a trailing zero
    ('"Ada"', '"\\u0041da"'),                                       # an escape json.dumps does not write
    ('"Ada"', '"a\\/b"'),                                           # an escaped "/"
    ('"Ada"', '"caf\\u00e9"'),                                      # ensure_ascii's escape
    ('"two"', "'two'"),                                             # single quotes
    ('"red"', '"pink"'),                                            # not one of the enum
    ("true", "1"),                                                  # 1 for a boolean
    ('"person"', '"robot"'),                                        # not the const
    ('"either": 7', '"either": "7"'),                               # none of anyOf
    ('{"label": "x", ', "{"),                                       # a nested required property missing
])
def test_other_spellings_and_invalid_values_are_refused(compiler, old, new):
    text = dumps(VALID[0])
    assert old in text and json.loads(text) == VALID[0]
    assert not accepts(compiler, json_grammar(SCHEMA), text.replace(old, new, 1))


def test_numbers_are_spelled_as_repr_writes_them(compiler):
    grammar = json_grammar({"type": "number"})
    rng = random.Random(0)
    floats = [rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30) for _ in range(300)] + [0.1, 1e-4, 1e16, 123.0]
    for x in floats + [rng.randint(-10**20, 10**20) for _ in range(50)]:
        assert accepts(compiler, grammar, dumps(x)), dumps(x)
    for text in ["1.0e+16", "1e16", "1E+16", "1e-5", "0.00001", "10000000000000000.0", "1.10", "00.5", ".5", "1.",
                 "+1", "NaN", "Infinity", "1e+05"]:
        assert not accepts(compiler, grammar, text), text
        assert not (math.isfinite(float(text)) and dumps(float(text)) == text)   # json.dumps never writes these


def test_optional_properties_come_in_schema_order_when_present(compiler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                               "c": {"type": "integer"}}, "required": ["b"]}
    grammar = json_grammar(schema)
    for present in (["b"], ["a", "b"], ["b", "c"], ["a", "b", "c"]):
        assert accepts(compiler, grammar, dumps({key: 1 for key in present})), present
    for keys in ([], ["a"], ["c"], ["b", "a"], ["c", "b"], ["a", "c", "b"]):
        assert not accepts(compiler, grammar, dumps({key: 1 for key in keys})), keys


def test_refs_recurse(compiler):
    node = {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array",
            "items": {"$ref": "#/$defs/node"}}}, "required": ["v", "kids"], "additionalProperties": False}
    grammar = json_grammar({"$defs": {"node": node}, "$ref": "#/$defs/node"})
    tree = {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]}
    assert accepts(compiler, grammar, dumps(tree))
    assert not accepts(compiler, grammar, dumps({"v": 1, "kids": [{"v": 2}]}))


def test_json_object_mode_takes_any_object_and_only_objects(compiler):
    grammar = json_grammar(None)
    for value in [{}, {"a": [1, 2.5, None, True, {"b": "c"}], "": "", "é": -1e-07}, VALID[1]]:
        assert accepts(compiler, grammar, dumps(value))
    for value in [[], "text", 1, None, [{}]]:
        assert not accepts(compiler, grammar, dumps(value))


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^a"}, {"type": "string", "minLength": 1}, {"type": "integer", "minimum": 0},
    {"type": "string", "format": "date"}, {"oneOf": [{"type": "string"}]}, {"type": "date"},
    {"type": "object", "properties": {"a": {}}, "additionalProperties": True}, {"$ref": "#/$defs/missing"},
    {"type": "array", "items": [{"type": "string"}]},
])
def test_what_a_grammar_cannot_express_is_refused(schema):
    with pytest.raises(ValueError):
        json_grammar(schema)


def test_tool_calls_are_accepted_exactly_as_the_chat_template_writes_them(compiler, qwen_tokenizer):
    calls = [("move", {"direction": "left", "steps": 3}), ("move", {"direction": "right"}),
             ("note", {"text": 'a "quoted" <b> and é\n'}), ("now", {}), ("now", {"when": ["today", 1.5, None]})]
    grammar = tool_call_grammar(TOOLS)
    stop = qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for name, arguments in calls:
        text = rendered_call(qwen_tokenizer, name, arguments)
        assert text == f'<tool_call>\n{{"name": "{name}", "arguments": {dumps(arguments)}}}\n</tool_call>'
        assert accepts(compiler, grammar, text)
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar), override_stop_tokens=[stop])
        ids = qwen_tokenizer.encode(text, add_special_tokens=False)
        assert ids[0] == qwen_tokenizer.convert_tokens_to_ids("<tool_call>")   # the template's ids, the added token
        assert all(matcher.accept_token(token) for token in ids + [stop]) and matcher.is_terminated()
        assert accepts(compiler, tool_call_grammar(TOOLS, name), text)
        other = "note" if name != "note" else "move"
        assert not accepts(compiler, tool_call_grammar(TOOLS, other), text)
    text = rendered_call(qwen_tokenizer, "move", {"direction": "left"})
    for variant in [text.replace("<tool_call>\n", "<tool_call>"), text.replace('"arguments": ', '"arguments":'),
                    text.replace("}\n</tool_call>", "}</tool_call>"), text + "\n", text + text,
                    text.replace('"left"', '"up"'), text.replace('"move"', '"jump"')]:
        assert not accepts(compiler, grammar, variant), variant


def test_tool_call_strings_never_hold_a_tool_call_tag(compiler, qwen_tokenizer):
    grammar = tool_call_grammar(TOOLS, "note")
    for text in ["<tool", "</tool_call", "tool_call>", "<<tool_call", "a </tool_cal> b", "<tool_call <x>"]:
        assert accepts(compiler, grammar, rendered_call(qwen_tokenizer, "note", {"text": text})), text
    for text in ["<tool_call>", "x </tool_call> y", "<<tool_call>", "</</tool_call>"]:
        assert not accepts(compiler, grammar, rendered_call(qwen_tokenizer, "note", {"text": text})), text
    assert not accepts(compiler, tool_call_grammar(TOOLS, "now"),
                       rendered_call(qwen_tokenizer, "now", {"<tool_call>": 1}))


def test_an_unknown_tool_is_refused():
    with pytest.raises(ValueError, match="no function named 'fly'"):
        tool_call_grammar(TOOLS, "fly")


def test_a_call_or_the_json_answer(compiler):
    """tool_choice "auto" with a JSON response format: either one call of a tool or the schema's JSON, nothing else."""
    grammar = call_or_json_grammar(TOOLS, {"type": "object", "properties": {"answer": {"type": "integer"}},
                                           "required": ["answer"]})
    call = '<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n</tool_call>'
    assert accepts(compiler, grammar, call) and accepts(compiler, grammar, '{"answer": 4}')
    unknown_tool = '<tool_call>\n{"name": "fly", "arguments": {}}\n</tool_call>'
    for text in ['{"answer": "4"}', "4", f"{call}{call}", unknown_tool]:
        assert not accepts(compiler, grammar, text), text
    assert accepts(compiler, call_or_json_grammar(TOOLS, None), '{"any": [1]}')
