import random

import pytest

from qwen25_tokenizer import ADDED_TOKENS, FIRST_ADDED_ID, QWEN2_PATTERN, tiktoken_path

tiktoken = pytest.importorskip("tiktoken")

MIXED_TEXT = """\
def fib(n: int) -> int:
    \"\"\"Return the n-th Fibonacci number.\"\"\"
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


class Agent:\r\n\tdef act(self, obs):  # THINK then ACTION\r\n\t\treturn {"action": "go north", 'x': 3.14159}

Numbers: 0 7 42 1234567890 3.14159 -2e-10 1,000,000 0x1F 2024-06-01T12:34:56Z  #123456
Unicode: naïve café résumé Ångström — “quotes” ‘single’ … 中文分词测试 日本語のテキスト 한국어 텍스트
Emoji: 🤖🚀👍🏽 👨‍👩‍👧‍👦  Math: ∑_{i=1}^{n} x_i² ≤ ∞, α β γ δ ∂f/∂x
Combining (NFD): cafe\u0301 Åström vs Åström
Whitespace runs:    four spaces,\t\ttabs,   \n\n\n   blank lines   \n  trailing   
I'm you're they've we'll he'd it's DON'T I'M HAVING HAVEN'T
You are an agent in a grid world. Observation: a red ball 2 steps left, a wall 3 steps forward.
THINK: the ball is to the left, so I should turn left first. ACTION: turn left
user: pick up the key
assistant: <think>I need the key.</think> ACTION: pick up
URLs: https://example.com/path?q=1&r=two#frag  email: someone@example.org
JSON: {"a": [1, 2, 3], "b": {"c": null, "d": true}}   !!!???...---___***
"""


@pytest.fixture(scope="module")
def reference_encoding():
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(tiktoken_path()))
    specials = {t: FIRST_ADDED_ID + i for i, (t, _) in enumerate(ADDED_TOKENS)}
    return tiktoken.Encoding("qwen2.5", pat_str=QWEN2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def test_encoding_equals_tiktoken(qwen_tokenizer, reference_encoding):
    import unicodedata

    rng = random.Random(0)
    lines = MIXED_TEXT.splitlines(keepends=True)
    texts = [MIXED_TEXT] + ["".join(rng.sample(lines, 8)) for _ in range(40)]
    texts += ["", " ", "\n", "  \n\n ", "12345678901234567890", "a" * 300, " " * 37 + "x"]
    total = 0
    for text in texts:
        # The HF tokenizer NFC-normalises first (as Qwen2's tokenizer.json does); tiktoken does not.
        expected = reference_encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        got = qwen_tokenizer.encode(text, add_special_tokens=False)
        assert got == expected, text
        assert qwen_tokenizer.decode(got) == unicodedata.normalize("NFC", text)
        total += len(got)
    assert total > 3000


def test_known_ids_and_specials(qwen_tokenizer):
    tok = qwen_tokenizer
    assert len(tok) == 151665
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tok.encode("12345", add_special_tokens=False) == [16, 17, 18, 19, 20]  # digits one by one
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                "<|object_ref_start|>": 151646, "<|video_pad|>": 151656, "<tool_call>": 151657,
                "</tool_call>": 151658, "<|fim_prefix|>": 151659, "<|file_sep|>": 151664}
    for token, i in expected.items():
        assert tok.convert_tokens_to_ids(token) == i
        assert tok.encode(token, add_special_tokens=False) == [i]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert set(tok.all_special_ids) == set(range(151643, 151657))
    # A special token inside text is one id, wherever it sits.
    assert tok.encode("a<|im_end|>\nb", add_special_tokens=False) == [64, 151645, 198, 65]


def test_chat_template(qwen_tokenizer):
    messages = [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "Where is the key?"},
        {"role": "assistant", "content": "THINK: look around. ACTION: look"},
        {"role": "tool", "content": "{\"result\": 3}"},
    ]
    text = qwen_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful agent.<|im_end|>\n"
        "<|im_start|>user\nWhere is the key?<|im_end|>\n"
        "<|im_start|>assistant\nTHINK: look around. ACTION: look<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"result\": 3}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = qwen_tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert no_prompt.endswith("Where is the key?<|im_end|>\n")
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)
    assert ids[:3] == [151644, 8948, 198]  # <|im_start|> system \n
    assert ids[-3:] == [151644, 77091, 198]  # <|im_start|> assistant \n


def test_cache_round_trip(tmp_path):
    from qwen25_tokenizer import build_qwen_tokenizer

    built = build_qwen_tokenizer(tmp_path / "tok")
    loaded = build_qwen_tokenizer(tmp_path / "tok")
    text = "<|im_start|>user\nHAVING 123 naïve<|im_end|>\n"
    assert loaded.encode(text) == built.encode(text)
    assert loaded.chat_template == built.chat_template and len(loaded) == 151665


def test_chat_template_with_tools_follows_qwen25(qwen_tokenizer):
    """Tool schemas in the system message, tool_calls as <tool_call> blocks, consecutive tool results in
    one user message: Qwen2.5's layout."""
    schema = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    messages = [
        {"role": "system", "content": "S"}, {"role": "user", "content": "U"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}},
            {"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}]},
        {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"},
    ]
    text = qwen_tokenizer.apply_chat_template(messages, tools=[schema], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object", '
        '"properties": {"a": {"type": "integer"}}, "required": ["a"]}}}\n</tools>\n\nFor each function call, '
        "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nU<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
