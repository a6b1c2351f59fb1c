"""Which rows share a prefix, and how long (learner/shared_prefix.prefix_groups, in_token_order), which groups
a micro-batch runs shared (fewest_slots, two_passes), and the attention windows the passes respect
(attention_window): expectations by hand."""

import torch

import pytest
from transformers import Gemma2Config, Llama4TextConfig, LlamaConfig, MistralConfig, Qwen2Config

from horizonrl.config import ConfigError
from horizonrl.learner.shared_prefix import (Plan, attention_window, fewest_slots, in_token_order, prefix_groups,
                                             shared_with_previous, two_passes)
from horizonrl.samples.tensors import Rows


def test_rows_sharing_a_prefix_form_one_group_and_a_row_alone_stays_out():
    a, b = [1] * 40, [2] * 40
    rows = [a + [5, 6], b + [7], a + [8], [9] * 50]
    assert prefix_groups(rows, min_shared=32) == [([0, 2], 40)]


def test_a_prefix_stops_one_token_before_the_shortest_rows_end():
    rows = [[1] * 40, [1] * 40 + [2, 3]]      # the first row is all prefix: 39 shared, its last token its own
    assert prefix_groups(rows, min_shared=32) == [([0, 1], 39)]


def test_a_run_splits_where_keeping_it_whole_would_skip_fewer_tokens():
    common = [1] * 32
    x, y = common + [2] * 100, common + [3] * 100
    rows = [x + [4], x + [5], y + [6], y + [7]]
    # whole: 3 x 32 = 96 tokens skipped; split: 132 + 132 = 264
    assert sorted(prefix_groups(rows, min_shared=32)) == [([0, 1], 132), ([2, 3], 132)]
    rows = [x + [4], x + [5], x + [6], y + [7]]
    # whole: 3 x 32 = 96; split: 2 x 132 = 264 (the y row alone)
    assert prefix_groups(rows, min_shared=32) == [([0, 1, 2], 132)]


def test_prefixes_shorter_than_the_minimum_are_not_shared():
    rows = [[1] * 20 + [2], [1] * 20 + [3]]
    assert prefix_groups(rows, min_shared=32) == []
    assert prefix_groups(rows, min_shared=8) == [([0, 1], 20)]


def test_ten_thousand_rows_of_one_prompt_are_one_group():
    """A GRPO group as a token budget packs it (no row cap; the prefix counted once): 10,000 rows of one 300-token
    prompt, each with a response of its own, share the prompt (the recursive grouping hit Python's recursion
    limit at about 1,000 rows)."""
    prompt = list(range(300))
    rows = [prompt + [1000 + i, 7] for i in range(10_000)]
    assert prefix_groups(rows, min_shared=32) == [(list(range(10_000)), 300)]


def test_a_long_chain_of_growing_histories_groups_the_rows_that_skip_most():
    """A stream's growing history: row k is the first 40 + k tokens of one sequence (2,000 rows, a chain as deep as
    the rows). Sorted rows k and k + 1 share 39 + k tokens, so keeping rows k.. together skips
    (1999 - k) x (39 + k) tokens, the most at k = 980: (1999 - 980) x 1019; rows 0..979 stay alone."""
    sequence = list(range(2_100))
    rows = [sequence[:40 + k] for k in range(2_000)]
    assert prefix_groups(rows, min_shared=32) == [(list(range(980, 2_000)), 1019)]


def test_rows_in_token_order_with_the_prefix_each_shares_with_the_one_before():
    rows = [[5, 6, 7, 8], [1, 2, 3], [5, 6, 9], [1, 2, 3, 4]]
    attention_mask = torch.tensor([[1] * len(r) + [0] * (4 - len(r)) for r in rows])
    data = Rows(torch.tensor([r + [0] * (4 - len(r)) for r in rows]), attention_mask, attention_mask.float())
    order, tokens = in_token_order(data, range(4))
    assert order == [1, 3, 0, 2] and tokens == [rows[i] for i in order]
    # sorted: [1, 2, 3], [1, 2, 3, 4], [5, 6, 7, 8], [5, 6, 9]; [1, 2, 3] keeps its last token: 2 shared, not 3
    assert shared_with_previous(tokens) == [0, 2, 0, 2]
    assert in_token_order(data, [0, 2]) == ([0, 2], [rows[0], rows[2]])


def test_a_group_whose_long_suffixes_would_pad_every_row_is_left_out():
    lengths = [64, 64, 64, 64, 66, 66]
    short, long = ([0, 1, 2, 3], 62), ([4, 5], 35)        # longest suffixes: 2 and 31 tokens
    # both: 2 prefixes x 62 + 6 suffixes x 31 = 310 slots; the short-suffix group and rows 4 and 5 alone (prefixes
    # of 65 tokens, suffixes of 1): 3 x 65 + 6 x 2 = 207; every row alone: 6 x 65 + 6 x 1 = 396; one pass: 6 x 66
    chosen = fewest_slots(lengths, [long, short])
    assert chosen.groups == [short, ([4], 65), ([5], 65)] and chosen.slots() == 207
    assert chosen.skipped() == 3 * 62 and chosen.computed() == sum(lengths) - 3 * 62


def test_groups_whose_suffixes_are_alike_all_stay_shared():
    lengths = [64, 64, 64, 64, 40, 40]
    first, second = ([0, 1, 2, 3], 62), ([4, 5], 36)      # longest suffixes: 2 and 4 tokens
    # both: 2 x 62 + 6 x 4 = 148 slots; the first and rows 4 and 5 alone: 3 x 62 + 6 x 2 = 198; none: 6 x 63 + 6 = 384
    chosen = fewest_slots(lengths, [first, second])
    assert chosen.groups == [second, first] and chosen.slots() == 148


def test_rows_that_share_nothing_run_the_plain_pass():
    """Every row alone computes as many slots as one plain pass (rows x longest) and costs a second pass: none."""
    assert fewest_slots([50, 40, 30], []) == Plan([50, 40, 30], [])
    assert Plan([50, 40, 30], []).slots() == 150 and Plan([50, 40, 30], []).computed() == 120
    # a group that saves less than its padding costs: rows 0 and 1 share 33 of 100 tokens, row 2 alone keeps 99 in
    # its prefix: 2 x 99 + 3 x 67 = 399 slots against 3 x 100 = 300 in one pass
    assert fewest_slots([100, 100, 100], [([0, 1], 33)]).groups == []


def test_rows_in_no_group_are_groups_of_their_own_keeping_one_token_for_the_second_pass():
    assert two_passes([5, 3, 4], [([1], 2)]) == [([1], 2), ([0], 4), ([2], 3)]
    assert two_passes([1, 0], []) == [([0], 0), ([1], 0)]          # a 1-token row and an all-padding one


def test_passes_wider_than_the_attention_window_cut_every_prefix_to_the_shortest():
    """Prefixes of 40 and 34 tokens, suffixes of up to 10: the passes are 40 + 10 = 50 wide. Within a window of 64
    the cache index never reaches a token past the window: kept. Past a window of 16 (a row of the 34-token group
    would see its 6 padding slots as tokens): every prefix 34, so that no padding lies before a suffix."""
    lengths, groups = [50, 46, 44, 39], [([0, 1], 40), ([2, 3], 34)]
    assert two_passes(lengths, groups, window=64) == groups
    assert two_passes(lengths, groups, window=16) == [([0, 1], 34), ([2, 3], 34)]
    assert fewest_slots(lengths, groups, window=16).groups == [([0, 1], 34), ([2, 3], 34)]
    # cut to a prefix shorter than min_shared, sharing is not worth its second pass
    assert fewest_slots(lengths + [12], groups, window=16).groups == []


def test_the_attention_window_of_each_layout():
    assert attention_window(LlamaConfig()) is None
    assert attention_window(Qwen2Config()) is None                              # use_sliding_window: false
    assert attention_window(Qwen2Config(use_sliding_window=True, max_window_layers=1, num_hidden_layers=3,
                                        sliding_window=512)) == 512
    assert attention_window(MistralConfig(sliding_window=16)) == 16              # no layer_types: every layer
    assert attention_window(MistralConfig(sliding_window=None)) is None
    assert attention_window(Gemma2Config(sliding_window=4096)) == 4096
    assert attention_window(Llama4TextConfig(attention_chunk_size=8192)) == 8192
    unknown = LlamaConfig()
    unknown.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ConfigError, match=r"optim.shared_prefix: LlamaConfig has layers of type linear_attention"):
        attention_window(unknown)
