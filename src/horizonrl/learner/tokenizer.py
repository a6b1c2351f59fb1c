"""A real byte-level BPE tokenizer with ChatML special tokens, trained offline on an env's text.

Byte-level BPE encodes any string (no unknown tokens). Merges may cross spaces but not newlines
("superword" tokens, as in SentencePiece without whitespace splitting): a sentence the env repeats
often becomes one token, so the tiny model's prompts are a few dozen tokens and the default job runs
in minutes on a CPU, while rare text still falls back to shorter pieces and bytes. A map drawn as text is
the exception: its symbols (`isolated`) stay tokens of their own, so a row is read cell by cell rather than
as one token per row the model saw in training (a held-out map would be new tokens). The special tokens
and the chat template match Qwen2.5's ChatML layout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5's ChatML layout, tools included: `tools` (OpenAI function schemas) are listed in the system
# message; an assistant message's `tool_calls` are written as <tool_call> blocks; consecutive `tool`
# messages share one user message of <tool_response> blocks. Unlike Qwen2.5's own template, no default
# system message is invented when the conversation has none.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' + (call['arguments'] | tojson) "
    "+ '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_bpe_tokenizer(corpus: Iterable[str], vocab_size: int = 1024, individual_digits: bool = False,
                        isolated: str = "") -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus` and wrap it as a Hugging Face fast tokenizer with ChatML.

    `<|im_end|>` is the EOS token (it ends every assistant message), `<|endoftext|>` the padding.
    The vocabulary may stay below `vocab_size` when the corpus has no more pairs to merge.
    `individual_digits`: every digit is a token of its own, as in Qwen2.5's tokenizer, so a number is
    copied digit by digit (tasks whose answers are numbers); else digits merge with the text around them.
    `isolated`: characters that are always a token of their own, wherever they stand (a map's symbols).
    """
    bpe = Tokenizer(models.BPE())
    digits = [pre_tokenizers.Digits(individual_digits=True)] if individual_digits else []
    symbols = [pre_tokenizers.Split(Regex(f"[{re.escape(isolated)}]"), behavior="isolated")] if isolated else []
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"), *digits, *symbols,
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
