import asyncio
import textwrap

import pytest

from horizonrl.tools.calculator import calculator
from horizonrl.tools.calls import ToolCall, ToolResult, format_tool_response, parse_tool_calls, run_tool_calls
from horizonrl.tools.registry import Tool, load_tools, tool, tool_table


def book_trip(city: str, nights: int, budget: float = 500.0, direct: bool = False) -> str:
    """Book a flight and a hotel
    in one go.

    Not part of the description.

    Args:
        city: Destination city.
        nights (int): Number of nights,
            at least one.
        budget: Highest total price in euros.

    Returns:
        A booking reference.
    """
    return f"{city}:{nights}"


def test_tool_schema_from_signature_and_docstring():
    assert tool(book_trip).schema == {
        "type": "function",
        "function": {
            "name": "book_trip",
            "description": "Book a flight and a hotel in one go.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "Destination city."},
                    "nights": {"type": "integer", "description": "Number of nights, at least one."},
                    "budget": {"type": "number", "description": "Highest total price in euros."},
                    "direct": {"type": "boolean"},
                },
                "required": ["city", "nights"],
            },
        },
    }


def test_tool_decorator_with_overrides_and_container_types():
    @tool(name="filter_rows", description="Keep some rows.")
    def keep(rows: list[dict], where: dict) -> str:
        return str(rows)

    assert (keep.name, keep.description) == ("filter_rows", "Keep some rows.")
    assert keep.parameters == {"type": "object", "properties": {"rows": {"type": "array"}, "where": {"type": "object"}},
                               "required": ["rows", "where"]}


def unsupported_annotation(paths: set) -> str:
    return str(paths)


def no_annotation(path) -> str:
    return str(path)


def star_args(*paths: str) -> str:
    return str(paths)


@pytest.mark.parametrize("fn,message", [(unsupported_annotation, "unsupported annotation"),
                                        (no_annotation, "needs a type annotation"),
                                        (star_args, "named arguments only")])
def test_tool_decorator_rejects_what_json_schema_cannot_say(fn, message):
    with pytest.raises(TypeError, match=message):
        tool(fn)


def test_tool_parameters_must_be_an_object_schema():
    with pytest.raises(ValueError, match="type 'object'"):
        Tool("x", "", {"type": "string"}, str)


def test_tool_table_rejects_duplicate_names():
    assert list(tool_table([calculator, tool(book_trip)])) == ["calculator", "book_trip"]
    with pytest.raises(ValueError, match="duplicate tool name 'calculator'"):
        tool_table([calculator, calculator])


@pytest.fixture
def weather_module(tmp_path, monkeypatch):
    """An importable module `weather_tools` with one typed function."""
    (tmp_path / "weather_tools.py").write_text(textwrap.dedent('''
        def forecast(city: str, days: int = 1) -> str:
            """Weather forecast for a city."""
            return f"sunny in {city}"
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_load_tools(tmp_path, weather_module):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent("""
        - function: horizonrl.tools.calculator:calculator
        - function: weather_tools:forecast
          name: weather
        - function: weather_tools:forecast
          name: raw_forecast
          description: The forecast, city only.
          parameters: {type: object, properties: {city: {type: string}}, required: [city]}
    """))
    calc, weather, raw = load_tools(path)
    assert calc == calculator
    assert (weather.name, weather.description) == ("weather", "Weather forecast for a city.")
    assert weather.parameters == {"type": "object",
                                  "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                                  "required": ["city"]}
    assert weather.fn(city="Oslo") == "sunny in Oslo"
    assert raw.schema["function"] == {"name": "raw_forecast", "description": "The forecast, city only.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}


@pytest.mark.parametrize("yaml_text,message", [
    ("- function: no_such_module_xyz:f", r"tool entry 0 .*cannot import module 'no_such_module_xyz'"),
    ("- function: weather_tools:rain", r"tool entry 0 .*has no attribute 'rain'"),
    ("- function: weather_tools.forecast", r"expected 'package.module:callable'"),
    ("- name: weather", r"needs a 'function: package.module:callable' field"),
    ("- {function: 'weather_tools:forecast', color: red}", r"unknown fields \['color'\]"),
    ("- function: horizonrl.tools.calculator:calculator\n- function: horizonrl.tools.calculator:calculator",
     "duplicate tool name 'calculator'"),
    ("function: weather_tools:forecast", "expected a list of tool entries"),
    ("- function: horizonrl.tools.calculator:MAX_INT_BITS", "is not callable"),
    ("- function: horizonrl.tools.calculator:checked", r"tool entry 0 .*unsupported annotation"),
])
def test_load_tools_errors(tmp_path, weather_module, yaml_text, message):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=message):
        load_tools(path)


def test_parse_one_call():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "2+3"})]


def test_parse_two_calls_in_order_with_string_arguments_and_no_whitespace():
    text = ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call> and '
            '<tool_call> {"name": "b"} </tool_call>')
    assert parse_tool_calls(text) == [ToolCall("a", {"x": 1}), ToolCall("b", {})]


@pytest.mark.parametrize("block,message", [
    ('{"name": "a", "arguments": {"x": 1}', "Error: tool call is not valid JSON: "),
    ('{"arguments": {"x": 1}}', 'Error: tool call must be a JSON object with a "name" string'),
    ('["a"]', 'Error: tool call must be a JSON object with a "name" string'),
    ('{"name": "a", "arguments": [1, 2]}', 'Error: tool call "arguments" must be a JSON object'),
    ('{"name": "a", "arguments": "x=1"}', "Error: tool call arguments string is not valid JSON: "),
])
def test_parse_malformed_call(block, message):
    (result,) = parse_tool_calls(f"<tool_call>\n{block}\n</tool_call>")
    assert result.error == "malformed" and result.content.startswith(message)


def test_parse_unclosed_call_is_reported_not_dropped():
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}'
    first, second = parse_tool_calls(text)
    assert first == ToolCall("a", {})
    assert second == ToolResult("", "Error: tool call is not closed with </tool_call>", "malformed")


def test_parse_text_without_calls():
    assert parse_tool_calls("THINK: no tools needed\nACTION: go left") == []


def run(calls, tools, max_parallel_calls=4, timeout_s=5.0):
    return asyncio.run(run_tool_calls(calls, tool_table(tools), max_parallel_calls, timeout_s))


def test_run_tool_calls_keeps_order_and_bounds_concurrency():
    running, peak = 0, 0

    @tool
    async def work(i: int) -> int:
        """Sleeps longer for earlier calls, so they finish last."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01 * (5 - i))
        running -= 1
        return i * 10

    results = run([ToolCall("work", {"i": i}) for i in range(5)], [work], max_parallel_calls=2)
    assert [(r.name, r.content, r.error) for r in results] == [("work", str(i * 10), None) for i in range(5)]
    assert peak == 2
    assert all(r.elapsed_s > 0 for r in results)


def test_run_tool_calls_reports_every_failure_in_place():
    """One time limit for every call: the calls that must not time out answer within their first step on the event
    loop (an async calculator), which no clock can beat, not from a worker thread that a loaded machine may start
    later than 0.2 s."""
    @tool
    async def sleepy(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "awake"

    @tool(name="calculator", description=calculator.description)
    async def calculator_at_once(expression: str) -> str:
        return calculator.fn(expression)

    malformed = ToolResult("", "Error: tool call is not valid JSON: ...", "malformed")
    calls = [ToolCall("calculator", {"expression": "2+3*4"}),
             ToolCall("sleepy", {"seconds": 10.0}),
             ToolCall("search", {"query": "x"}),
             ToolCall("calculator", {"formula": "1"}),
             ToolCall("calculator", {"expression": "1/0"}),
             malformed]
    results = run(calls, [calculator_at_once, sleepy], timeout_s=0.2)
    assert (results[0].content, results[0].error) == ("14", None)
    assert results[1].error == "timeout" and results[1].content == "Error: sleepy timed out after 0.2 s"
    assert results[2] == ToolResult("search", "Error: unknown tool 'search'; available tools: calculator, sleepy",
                                    "unknown_tool")
    assert results[3].error == "bad_arguments" and "missing a required argument: 'expression'" in results[3].content
    assert (results[4].error, results[4].content) == ("exception", "Error: ZeroDivisionError: division by zero")
    assert results[5] is malformed


def test_format_tool_response():
    assert format_tool_response(ToolResult("calculator", "14")) == "<tool_response>\n14\n</tool_response>"


@pytest.mark.parametrize("expression,value", [
    ("2+3*4", "14"), ("7/2", "3.5"), ("(1+2)**3", "27"), ("10//3", "3"), ("10 % 4", "2"), ("-3 + +5", "2"),
    ("4/2", "2"), ("0.1+0.2", "0.3"), ("1/3", "0.3333333333"), ("2**-1", "0.5"), ("1e20*10", "1e+21"),
    ("2**100", "1267650600228229401496703205376"), ("  6 * 7 ", "42"),
])
def test_calculator(expression, value):
    assert calculator.fn(expression) == value


@pytest.mark.parametrize("expression,error,message", [
    ("__import__('os')", ValueError, "unsupported expression"),
    ("abs(-1)", ValueError, "unsupported expression"),
    ("(1).real", ValueError, "unsupported expression"),
    ("x + 1", ValueError, "unsupported expression"),
    ("'a' * 3", ValueError, "unsupported expression"),
    ("True + 1", ValueError, "unsupported expression"),
    ("1 < 2", ValueError, "unsupported expression"),
    ("2 +", ValueError, "unsupported expression"),
    ("9**9**9", ValueError, "too large"),
    ("(2**5000) * (2**6000)", ValueError, "too large"),
    ("(-8) ** 0.5", ValueError, "not a real number"),
    ("1/0", ZeroDivisionError, "division by zero"),
])
def test_calculator_errors(expression, error, message):
    with pytest.raises(error, match=message):
        calculator.fn(expression)


def test_calculator_schema():
    assert calculator.schema["function"]["parameters"] == {
        "type": "object",
        "properties": {"expression": {"type": "string",
                                      "description": 'The expression to evaluate, e.g. "(2 + 3) * 4 / 7".'}},
        "required": ["expression"]}
