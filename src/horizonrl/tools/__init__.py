"""Tools an agent can call: declaration (registry), the Qwen/Hermes call format (calls), built-ins."""

from horizonrl.tools.calculator import calculator
from horizonrl.tools.calls import (ToolCall, ToolResult, format_tool_response, parse_tool_calls, run_tool_calls,
                                   truncate_to_tokens)
from horizonrl.tools.registry import Tool, load_tools, tool, tool_table
from horizonrl.tools.sandbox import SandboxResult, python, run_python

__all__ = ["SandboxResult", "Tool", "ToolCall", "ToolResult", "calculator", "format_tool_response", "load_tools",
           "parse_tool_calls", "python", "run_python", "run_tool_calls", "tool", "tool_table", "truncate_to_tokens"]
