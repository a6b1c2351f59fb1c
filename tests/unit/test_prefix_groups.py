"""Which rows share a prefix, and how long (learner/shared_prefix.prefix_groups, in_token_order), and which groups
a micro-batch runs shared (fewest_slots): expectations by hand."""

import torch

from horizonrl.learner.shared_prefix import alone, fewest_slots, in_token_order, prefix_groups


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


def test_rows_in_token_order_with_the_prefix_each_shares_with_the_one_before():
    rows = [[5, 6, 7, 8], [1, 2, 3], [5, 6, 9], [1, 2, 3, 4]]
    data = {"input_ids": torch.tensor([r + [0] * (4 - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (4 - len(r)) for r in rows])}
    # sorted: [1, 2, 3], [1, 2, 3, 4], [5, 6, 7, 8], [5, 6, 9]; [1, 2, 3] keeps its last token: 2 shared, not 3
    assert in_token_order(data, range(4)) == ([1, 3, 0, 2], [0, 2, 0, 2])
    assert in_token_order(data, [0, 2]) == ([0, 2], [0, 2])


def test_a_group_whose_long_suffixes_would_pad_every_row_is_left_out():
    lengths = [64, 64, 64, 64, 66, 66]
    short, long = ([0, 1, 2, 3], 62), ([4, 5], 35)        # longest suffixes: 2 and 31 tokens
    # both: 2 prefixes x 62 + 6 suffixes x 31 = 310 slots; the short-suffix group and rows 4 and 5 alone (prefixes
    # of 65 tokens, suffixes of 1): 3 x 65 + 6 x 2 = 207; every row alone: 6 x 65 + 6 x 1 = 396
    assert fewest_slots(lengths, [long, short]) == [short]


def test_groups_whose_suffixes_are_alike_all_stay_shared():
    lengths = [64, 64, 64, 64, 40, 40]
    first, second = ([0, 1, 2, 3], 62), ([4, 5], 36)      # longest suffixes: 2 and 4 tokens
    # both: 2 x 62 + 6 x 4 = 148 slots; the first and rows 4 and 5 alone: 3 x 62 + 6 x 2 = 198; none: 6 x 63 + 6 = 384
    assert fewest_slots(lengths, [first, second]) == [second, first]


def test_rows_in_no_group_are_groups_of_their_own_keeping_one_token_for_the_second_pass():
    assert alone([5, 3, 4], [([1], 2)]) == [([0], 4), ([2], 3)]
