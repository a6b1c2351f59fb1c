"""Tools an agent may call, declared with OpenAI function schemas.

A `Tool` is a name, a description, a JSON schema of type "object" for its keyword arguments, and the
Python callable (sync or async) that runs it. Its `schema` is the entry the chat template lists:
`{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}`.

Tools come from the `@tool` decorator, which reads the schema off a typed Python function, or from a
YAML file (`load_tools`) listing `{function: "package.module:callable", name?, description?,
parameters?}` entries; fields given in the file win over those read off the function.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import re
import sys
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
ARG_ENTRY = re.compile(r"(\w+)\s*(?:\(.*\))?\s*:\s*(.*)")
ENTRY_FIELDS = ("function", "name", "description", "parameters")


@dataclass(frozen=True)
class Tool:
    """A callable tool; `fn` receives the call's arguments as keyword arguments and returns text
    (or anything `str()` turns into it)."""

    name: str
    description: str
    parameters: dict    # JSON schema of type "object" for fn's keyword arguments
    fn: Callable

    def __post_init__(self):
        if not isinstance(self.parameters, dict) or self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema of type 'object', "
                             f"got {self.parameters!r}")

    @property
    def schema(self) -> dict:
        """The OpenAI function-calling declaration of this tool."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def docstring_summary(doc: str | None) -> str:
    """The first paragraph of a docstring on one line ("" without a docstring)."""
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def indentation(line: str) -> int:
    return len(line) - len(line.lstrip())


def docstring_args(doc: str | None) -> dict[str, str]:
    """Argument descriptions from a Google-style `Args:` section ({} without one).

    Entries read `name (type): text` (the type is optional) and may continue on more-indented lines;
    the section ends at the first non-blank line indented no deeper than its `Args:` header.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    header = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if header is None:
        return {}
    descriptions, name, entry_indent = {}, None, None
    for line in lines[header + 1:]:
        if not line.strip():
            continue
        if indentation(line) <= indentation(lines[header]):
            break
        if entry_indent is None:
            entry_indent = indentation(line)
        entry = ARG_ENTRY.fullmatch(line.strip())
        if indentation(line) == entry_indent and entry:
            name = entry[1]
            descriptions[name] = entry[2]
        elif name is not None:
            descriptions[name] = f"{descriptions[name]} {line.strip()}"
    return descriptions


def json_type(annotation, where: str) -> str:
    """The JSON schema type of a parameter annotation (`list[int]` counts as `list`)."""
    json_name = JSON_TYPES.get(typing.get_origin(annotation) or annotation)
    if json_name is None:
        supported = ", ".join(t.__name__ for t in JSON_TYPES)
        raise TypeError(f"{where}: unsupported annotation {annotation!r}; a tool parameter must be one of {supported}")
    return json_name


def parameters_schema(fn: Callable) -> dict:
    """JSON schema of fn's keyword arguments: one typed property per parameter, with its `Args:`
    description when the docstring has one; parameters without a default are required."""
    hints = typing.get_type_hints(fn)
    descriptions = docstring_args(fn.__doc__)
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        where = f"{fn.__qualname__}({param.name})"
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"{where}: a tool takes named arguments only, not *args, **kwargs or positional-only ones")
        if param.name not in hints:
            raise TypeError(f"{where}: a tool parameter needs a type annotation")
        properties[param.name] = {"type": json_type(hints[param.name], where)}
        if param.name in descriptions:
            properties[param.name]["description"] = descriptions[param.name]
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required}


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None,
         parameters: dict | None = None):
    """Decorator making a `Tool` of a typed function: `@tool` or `@tool(name=..., description=...)`.

    Defaults: the function's name, its docstring's first paragraph, the schema of its signature
    (see `parameters_schema`); `parameters` replaces that schema instead of reading it.
    """
    def build(fn: Callable) -> Tool:
        return Tool(name=name or fn.__name__,
                    description=docstring_summary(fn.__doc__) if description is None else description,
                    parameters=parameters_schema(fn) if parameters is None else parameters,
                    fn=fn)
    return build if fn is None else build(fn)


def import_target(reference: str):
    """The object a `package.module:attribute` or `path/to/file.py:attribute` reference names (the
    attribute may be dotted; a file path is relative to the working directory): a user's own agent or
    reward function need not be an installed package."""
    module_name, _, attribute = reference.rpartition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected 'package.module:callable' or 'file.py:callable', got {reference!r}")
    try:
        if module_name.endswith(".py"):
            module = import_file(Path(module_name))
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError, SyntaxError) as err:
        raise ValueError(f"cannot import module {module_name!r}: {err}") from err
    try:
        return functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None


def import_file(path: Path):
    """The module in the Python file `path`, loaded once per process (kept in sys.modules under its resolved path,
    so the objects it defines are the same at every import)."""
    name = f"horizonrl_user_{path.resolve().as_posix()}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or not path.is_file():
            raise ImportError(f"no Python file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def tool_from_entry(entry: dict) -> Tool:
    """The tool a YAML entry describes; an entry naming a `Tool` gets the entry's fields applied to it."""
    if not isinstance(entry, dict) or "function" not in entry:
        raise ValueError("an entry needs a 'function: package.module:callable' field")
    unknown = set(entry) - set(ENTRY_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; allowed: {list(ENTRY_FIELDS)}")
    target = import_target(entry["function"])
    overrides = {field: entry[field] for field in ENTRY_FIELDS[1:] if field in entry}
    if isinstance(target, Tool):
        return replace(target, **overrides)
    if not callable(target):
        raise ValueError(f"{entry['function']!r} is not callable")
    return tool(target, **overrides)


def load_tools(path: str | Path) -> list[Tool]:
    """The tools a YAML file lists, in file order; ValueError naming the entry when one is wrong,
    and when two tools share a name."""
    entries = yaml.safe_load(Path(path).read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of tool entries, got {type(entries).__name__}")
    tools = []
    for index, entry in enumerate(entries):
        try:
            tools.append(tool_from_entry(entry))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: tool entry {index} ({entry!r}): {err}") from err
    return list(tool_table(tools).values())


def tools_from_references(references: list[str]) -> dict[str, Tool]:
    """Tools by name from "module:name" references (a Tool or a plain function) and tools YAML files
    (a task's `tools`); ValueError naming the reference that does not load."""
    tools: list[Tool] = []
    for reference in references:
        if reference.endswith((".yaml", ".yml")):
            if not Path(reference).is_file():
                raise ValueError(f"tools file {reference!r} not found")
            tools += load_tools(reference)
        else:
            try:
                tools.append(tool_from_entry({"function": reference}))
            except (TypeError, ValueError) as err:
                raise ValueError(f"tool {reference!r}: {err}") from None
    return tool_table(tools)


def tool_table(tools: Iterable[Tool]) -> dict[str, Tool]:
    """Tools by name; ValueError when two share a name."""
    table = {}
    for t in tools:
        if t.name in table:
            raise ValueError(f"duplicate tool name {t.name!r}")
        table[t.name] = t
    return table
