"""Grammars for structured output: the text a constrained response must be, as xgrammar EBNF.

Both engines that honour `SamplingParams.grammar` read this dialect: the hf engine compiles it with
xgrammar (engines/constrained.py) and vLLM with its default structured-output backend, xgrammar too
(`StructuredOutputsParams(grammar=...)`).

Every JSON value is allowed only in the one spelling that Python's `json.dumps(value, ensure_ascii=False)`
writes (what a chat template's `tojson` writes): separators ", " and ": ", no other whitespace, object
properties in schema order, strings with json.dumps's escapes only (`\\"`, `\\\\`, `\\b \\f \\n \\r \\t`,
`\\u00XX` in lower case for the other control characters; every other character as itself), integers
without leading zeros or "-0", and floats as `repr` writes them (a fraction without trailing zeros or
".0"; the exponent form below 1e-4 and from 1e16, e.g. "1e-05", "1e+16"). So a value the model writes
renders again as the same text, except a float with more digits than a double holds (repr rounds it).
Duplicate keys of a free-form object are not excluded.

JSON Schema keywords honoured: type (one or a list), properties, required (other properties may be left
out, in order), additionalProperties (with properties: only false, the default here as in xgrammar's
strict mode; without: the schema of every value), items, enum, const, anyOf, $ref to #/$defs/... or
#/definitions/... (recursion included). Annotations (title, description, default, examples, $schema,
strict) are ignored; any other keyword constrains what this cannot express exactly and is a ValueError.
"""

from __future__ import annotations

import json

from horizonrl.tools.calls import CLOSE_TAG, OPEN_TAG

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "strict"}
HONOURED = {"type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref",
            "$defs", "definitions"}
ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}  # in EBNF literals


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _literal(text: str) -> str:
    """`text` as an EBNF string literal."""
    escaped = "".join(ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 else c) for c in text)
    return f'"{escaped}"'


def _family(name: str, string: str) -> str:
    """The rules of `<name>_value` (any JSON value), `<name>_object`, `<name>_array` and `<name>_string`, whose
    strings are `string`'s rules (they define `<name>_string`)."""
    return (f'{name}_value ::= {name}_object | {name}_array | {name}_string | json_number | "true" | "false" | "null"\n'
            f'{name}_object ::= "{{" ({name}_string ": " {name}_value (", " {name}_string ": " {name}_value)*)? "}}"\n'
            f'{name}_array ::= "[" ({name}_value (", " {name}_value)*)? "]"\n{string}')


def _tag_free_string() -> str:
    """The rules of `call_string`: a JSON string whose text never contains OPEN_TAG or CLOSE_TAG (tools/calls.py
    splits a response at them, so a call whose argument held one would not parse back). A rule per partial
    match: `s` none, `lt` after "<", `sl` after "</", `m<k>` after that and the first k characters of the
    tags' tail "tool_call>", whose last character is then not allowed; any other character goes back to `s`
    ("<" to `lt`), and so does an escape sequence (the tags have none)."""
    tail = OPEN_TAG[1:]
    assert CLOSE_TAG == "</" + tail and "<" not in tail
    moves = {"s": {}, "lt": {"/": "sl", tail[0]: "m1"}, "sl": {tail[0]: "m1"}}
    moves |= {f"m{k}": {tail[k]: f"m{k + 1}" if k + 1 < len(tail) else None} for k in range(1, len(tail))}
    rules = ['call_string ::= "\\"" call_string_s\n']
    for state, to in moves.items():
        to = {"<": "lt", **to}
        others = "".join("\\" + c if c in "\\]^-" else c for c in to)
        alternatives = ['"\\""', '"\\\\" json_escape call_string_s', f'[^"\\\\\\x00-\\x1f{others}] call_string_s']
        alternatives += [f"{_literal(c)} call_string_{after}" for c, after in to.items() if after is not None]
        rules.append(f"call_string_{state} ::= {' | '.join(alternatives)}\n")
    return "".join(rules)


# String escapes and numbers, spelled as json.dumps spells them.
ESCAPES_AND_NUMBERS = r"""json_escape ::= ["\\bfnrt] | "u00" ("0" [0-7bef] | "1" [0-9a-f])
json_integer ::= "0" | "-"? [1-9] [0-9]*
json_number ::= json_integer | "-"? (json_fixed | json_exponent)
json_fixed ::= "0." ("0" | "0"{0,3} [1-9] ([0-9]* [1-9])?) | [1-9] [0-9]{0,15} "." ("0" | [0-9]* [1-9])
json_exponent ::= [1-9] ("." [0-9]* [1-9])? "e" json_exponent_power
json_exponent_power ::= "-0" [5-9] | "-" [1-9] [0-9]+ | "+1" [6-9] | "+" [2-9] [0-9] | "+" [1-9] [0-9] [0-9]+
"""
# A string's characters recurse rather than repeat (`json_char*`): xgrammar then masks a step ~1000x faster on
# Qwen2.5's vocabulary (15 us, not 22 ms; benchmarks/constrained_decoding.py).
JSON_STRING = r"""json_string ::= "\"" json_string_rest
json_string_rest ::= "\"" | [^"\\\x00-\x1f] json_string_rest | "\\" json_escape json_string_rest
"""
# What every grammar here ends with: escapes, numbers and two families of any JSON value (see _family),
# `json_*` and, for tool-call arguments, `call_*`, whose strings hold no tool-call tag.
PRIMITIVES = (ESCAPES_AND_NUMBERS + _family("json", JSON_STRING)
              + _family("call", _tag_free_string())).removesuffix("\n")
TOOL_CALL_END = "}\n" + CLOSE_TAG
SCALARS = {"integer": "json_integer", "number": "json_number", "boolean": '("true" | "false")', "null": '"null"'}


def json_grammar(schema: dict | None) -> str:
    """Any JSON object (`schema` None: OpenAI's json_object mode) or a JSON value matching `schema`."""
    return _grammar(*_json_answer(schema))


def tool_call_grammar(tools: list[dict], name: str | None = None) -> str:
    """Exactly one tool-call block as the chat template writes an assistant's call (tools/calls.py):
    `<tool_call>\\n{"name": "<NAME>", "arguments": <ARGUMENTS>}\\n</tool_call>`, the name written as is and
    the arguments a JSON object matching the function's `parameters` (any object when it has none), whose
    strings hold no `<tool_call>` or `</tool_call>`. `tools` are OpenAI tool schemas ({"type": "function",
    "function": {"name", "parameters"}}); `name`: the one tool to call (tool_choice naming a function), None:
    any of them (tool_choice "required")."""
    return _grammar(*_tool_call(tools, name))


def call_or_json_grammar(tools: list[dict], schema: dict | None) -> str:
    """One tool call (as `tool_call_grammar(tools)`) or the JSON answer (as `json_grammar(schema)`): tool_choice
    "auto" with a JSON response format."""
    (call, call_rules), (answer, answer_rules) = _tool_call(tools, None), _json_answer(schema)
    return _grammar(f"({call}) | ({answer})", call_rules + answer_rules)


def _grammar(root: str, rules: str) -> str:
    return f"root ::= {root}\n{rules}{PRIMITIVES}\n"


def _json_answer(schema: dict | None) -> tuple[str, str]:
    """(the expression, the rules it needs) of `json_grammar`."""
    if schema is None:
        return "json_object", ""
    rules = _Rules(schema, "s", "json")
    return rules.value(schema), rules.text()


def _tool_call(tools: list[dict], name: str | None) -> tuple[str, str]:
    """(the expression, the rules it needs) of `tool_call_grammar`."""
    functions = [tool["function"] for tool in tools if tool.get("type", "function") == "function"]
    if name is not None:
        functions = [f for f in functions if f["name"] == name]
    if not functions:
        raise ValueError(f"no function named {name!r} among the tools" if name else "no function among the tools")
    calls, definitions = [], []
    for index, function in enumerate(functions):
        parameters = function.get("parameters")
        if parameters is None:
            arguments = "call_object"
        else:
            rules = _Rules(parameters, f"t{index}", "call")
            arguments = rules.value(parameters)
            definitions.append(rules.text())
        head = _literal(f'{OPEN_TAG}\n{{"name": "{function["name"]}", "arguments": ')
        calls.append(f"{head} {arguments} {_literal(TOOL_CALL_END)}")
    return " | ".join(f"({call})" for call in calls), "".join(definitions)


class _Rules:
    """The EBNF rules for the sub-schemas of one root schema, named `<prefix>_<n>` (its $defs
    `<prefix>_def_<n>`), so that the rules of several schemas live in one grammar; free-form values and
    strings are those of PRIMITIVES' `family` ("json" or "call")."""

    def __init__(self, root: dict, prefix: str, family: str):
        self.root, self.prefix, self.family = root, prefix, family
        self.rules: dict[str, str] = {}
        self.defs: dict[str, str] = {}  # $ref -> rule name

    def text(self) -> str:
        return "".join(f"{name} ::= {body}\n" for name, body in self.rules.items())

    def _new(self, body: str) -> str:
        name = f"{self.prefix}_{len(self.rules)}"
        self.rules[name] = body
        return name

    def value(self, schema: dict | bool) -> str:
        """An EBNF expression for the values matching `schema`."""
        if schema is True or schema == {}:
            return f"{self.family}_value"
        if not isinstance(schema, dict):
            raise ValueError(f"a schema must be an object or true, got {schema!r}")  # noqa: TRY004  (one error type)
        unknown = set(schema) - HONOURED - ANNOTATIONS
        if unknown:
            raise ValueError(f"JSON Schema keywords not supported in a grammar: {sorted(unknown)}")
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "const" in schema:
            return _literal(_dumps(schema["const"]))
        if "enum" in schema:
            return "(" + " | ".join(_literal(_dumps(v)) for v in schema["enum"]) + ")"
        if "anyOf" in schema:
            return "(" + " | ".join(self.value(option) for option in schema["anyOf"]) + ")"
        types = schema.get("type")
        if types is None:
            types = ["object"] if "properties" in schema else ["array"] if "items" in schema else None
        if types is None:
            return f"{self.family}_value"
        return "(" + " | ".join(self._typed(t, schema) for t in ([types] if isinstance(types, str) else types)) + ")"

    def _typed(self, kind: str, schema: dict) -> str:
        if kind == "object":
            return self._object(schema)
        if kind == "array":
            item = self.value(schema.get("items", True))
            return self._new(f'"[" ({item} (", " {item})*)? "]"')
        if kind == "string":
            return f"{self.family}_string"
        if kind not in SCALARS:
            raise ValueError(f"unknown JSON Schema type {kind!r}")
        return SCALARS[kind]

    def _object(self, schema: dict) -> str:
        """`{` the present properties in schema order, joined by ", " `}`: `first` spells properties i..
        when none came before, `rest` when some did (each present one then follows ", ")."""
        properties = schema.get("properties")
        extra = schema.get("additionalProperties", not properties)
        if not properties:
            if extra is False:
                return '"{}"'
            value = self.value(extra)
            key = f"{self.family}_string"
            return self._new(f'"{{" ({key} ": " {value} (", " {key} ": " {value})*)? "}}"')
        if extra is not False:
            raise ValueError("additionalProperties beside properties is not supported in a grammar (only false)")
        required, keys = set(schema.get("required", [])), list(properties)
        first, rest = '""', ""
        for i in reversed(range(len(keys))):
            member = f"{_literal(_dumps(keys[i]) + ': ')} {self.value(properties[keys[i]])}"
            optional = keys[i] not in required
            if i == 0 or keys[i - 1] not in required:  # only then does a rule name first[i]
                first = self._new(f"{member} {rest} | {first}" if optional else f"{member} {rest}")
            if i > 0:
                rest = self._new(f'(", " {member})? {rest}' if optional else f'", " {member} {rest}')
        return self._new(f'"{{" {first} "}}"')

    def _ref(self, ref: str) -> str:
        for section in ("$defs", "definitions"):
            head = f"#/{section}/"
            if ref.startswith(head) and ref[len(head):] in self.root.get(section, {}):
                if ref not in self.defs:
                    self.defs[ref] = name = f"{self.prefix}_def_{len(self.defs)}"
                    self.rules[name] = ""   # reserved before its body, which may refer to it
                    self.rules[name] = self.value(self.root[section][ref[len(head):]])
                return self.defs[ref]
        raise ValueError(f"$ref {ref!r} is not one of the root schema's $defs or definitions")
