"""Tool output cut to a token budget, counted in the exact Qwen2.5 tokenizer's tokens (the session-scoped
`qwen_tokenizer` fixture takes seconds to load)."""

from horizonrl.tools.calls import truncate_to_tokens


def test_truncate_to_tokens(qwen_tokenizer):
    text = "one two three four five six"
    assert truncate_to_tokens(text, qwen_tokenizer, 6) == text
    assert truncate_to_tokens(text, qwen_tokenizer, 3) == "one two three\n...[truncated 3 tokens]"
