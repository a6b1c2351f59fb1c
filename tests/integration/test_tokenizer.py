import pytest

from horizonrl.agents.agent import chat_prompt_ids
from horizonrl.learner.models import check_compatible, load_policy
from horizonrl.learner.tokenizer import SPECIAL_TOKENS


def test_chatml_special_tokens_are_single_ids(river_tiny):
    tokenizer, _ = river_tiny
    for token in SPECIAL_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_through_apply_chat_template(river_tiny):
    tokenizer, _ = river_tiny
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "The next stone is to your left."}]
    ids = chat_prompt_ids(tokenizer, messages)
    assert tokenizer.decode(ids) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n"
                                    "The next stone is to your left.<|im_end|>\n<|im_start|>assistant\n")


def test_byte_level_round_trip_of_unseen_text(river_tiny):
    tokenizer, _ = river_tiny
    text = "Zebra crossing: ünïcödé, 数字 42 and tabs\t!"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_save_and_load_by_path(river_tiny, tmp_path):
    tokenizer, model = river_tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded_tokenizer, loaded = load_policy(str(tmp_path), device="cpu")
    assert loaded_tokenizer.encode("The next stone is") == tokenizer.encode("The next stone is")
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert (a == b).all(), name


def test_model_tokenizer_mismatch_is_one_clear_error(river_tiny):
    tokenizer, model = river_tiny
    from transformers import AutoModelForCausalLM

    small = AutoModelForCausalLM.from_config(model.config.__class__(**{**model.config.to_dict(), "vocab_size": 100}))
    with pytest.raises(ValueError, match=r"tokenizer has \d+ tokens but the model embeds only 100"):
        check_compatible(tokenizer, small, "tiny")


def test_a_maps_symbols_stay_a_token_each_through_save_and_load(tmp_path):
    """Sokoban's rows, seen often enough to merge into one token each, are read symbol by symbol when the
    env's map_symbols are isolated, before and after a save; other text still merges."""
    from transformers import AutoTokenizer

    from horizonrl.envs.sokoban import Sokoban
    from horizonrl.learner.tokenizer import train_bpe_tokenizer

    corpus = ["#__X_O#\n#P____#\nmoves to solve"] * 50
    merged = train_bpe_tokenizer(corpus, 300)
    assert "#__X_O#" in merged.tokenize("#__X_O#")             # without isolation a row is one token
    isolated = train_bpe_tokenizer(corpus, 300, isolated=Sokoban.map_symbols)
    isolated.save_pretrained(tmp_path)
    for tokenizer in isolated, AutoTokenizer.from_pretrained(tmp_path):
        assert tokenizer.tokenize("#__X_O#\n#P____#") == [*"#__X_O#", "Ċ", *"#P____#"]
        assert len(tokenizer.tokenize("moves to solve")) == 1
