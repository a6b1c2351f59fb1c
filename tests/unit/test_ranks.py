import pytest

from horizonrl.learner.distributed import LOCAL, Ranks


@pytest.mark.parametrize("n,world,expected", [
    (8, 2, [range(0, 4), range(4, 8)]),
    (7, 3, [range(0, 3), range(3, 5), range(5, 7)]),      # 7 = 3 + 2 + 2: lower ranks take the extra one
    (2, 4, [range(0, 1), range(1, 2), range(2, 2), range(2, 2)]),
])
def test_share_cuts_n_items_into_contiguous_near_equal_parts(n, world, expected):
    shares = [Ranks(rank, world).share(n) for rank in range(world)]
    assert shares == expected
    assert [i for share in shares for i in share] == list(range(n))


def test_a_plain_process_reduces_to_itself():
    assert LOCAL.sum([1.5, 2.0]) == [1.5, 2.0] and LOCAL.max(3) == 3
    assert LOCAL.gather("x") == ["x"] and LOCAL.broadcast(7) == 7 and LOCAL.is_main
