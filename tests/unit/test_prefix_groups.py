"""Which rows share a prefix, and how long (learner/shared_prefix.prefix_groups): expectations by hand."""

from horizonrl.learner.shared_prefix import prefix_groups


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
