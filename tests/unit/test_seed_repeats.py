"""Which requests repeat an earlier one's prompt and fixed seed at the same weights version: by hand on a short
sequence, and against RequestSeeds itself (a repeat is a request whose random stream and prompt an earlier
request of its version had, so that it samples the same response)."""

import random

from horizonrl.engines.base import RequestSeeds, SeedRepeats

A, B = [1, 2, 3], [1, 2, 4]


def test_a_repeat_is_the_same_prompt_and_seed_at_the_same_version():
    repeats = SeedRepeats()
    sequence = [(A, 42, 0, False), (A, 42, 0, True), (A, 42, 0, True),   # a group of three sending seed 42
                (B, 42, 0, False),                                        # the same seed, another prompt
                (A, 7, 0, False), (A, None, 0, False), (A, None, 0, False),   # another seed; none
                (A, 42, None, False), (A, 42, None, False),               # an engine without weights
                (A, 42, 1, False), (A, 42, 1, True),                      # the weights changed
                (B, 42, 0, False), (B, 42, 0, False),                     # in flight across the update: not checked
                (B, 42, 1, False), (B, 42, 1, True)]
    assert [repeats.repeats(prompt, seed, version) for prompt, seed, version, _ in sequence] == [
        expected for *_, expected in sequence]


def test_the_repeats_are_the_requests_that_request_seeds_gives_an_earlier_ones_stream():
    rng = random.Random(0)
    seeds, repeats = RequestSeeds(seed=5), SeedRepeats()
    streams: set[tuple[int, int, tuple[int, ...]]] = set()   # (version, stream seed, prompt) of the requests so far
    counted = 0
    for _ in range(400):
        if rng.random() < 0.05:
            seeds.new_version()
        prompt, seed = rng.choice([A, B, [7]]), rng.choice([None, 1, 2, 3])
        key = (seeds.version, seeds.next(prompt, seed), tuple(prompt))
        expected = key in streams
        streams.add(key)
        counted += expected
        assert repeats.repeats(prompt, seed, seeds.version) == expected
    assert counted > 100
