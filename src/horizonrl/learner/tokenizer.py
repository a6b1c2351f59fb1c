"""A real byte-level BPE tokenizer with ChatML special tokens, trained offline on an env's text.

Byte-level BPE encodes any string (no unknown tokens). Merges may cross spaces but not newlines
("superword" tokens, as in SentencePiece without whitespace splitting): a sentence the env repeats
often becomes one token, so the tiny model's prompts are a few dozen tokens and the default job runs
in minutes on a CPU, while rare text still falls back to shorter pieces and bytes. The special tokens
and the chat template match Qwen2.5's ChatML layout.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_bpe_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus` and wrap it as a Hugging Face fast tokenizer with ChatML.

    `<|im_end|>` is the EOS token (it ends every assistant message), `<|endoftext|>` the padding.
    The vocabulary may stay below `vocab_size` when the corpus has no more pairs to merge.
    """
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
