"""A batch's keys as a few ranges (sync/delta/merge.py `cover`): every key inside one,
as few integers outside them as the number of ranges allows."""

import random

from sync.delta.merge import cover


def test_no_keys_no_ranges():
    assert cover([], 16) == []


def test_one_key_is_one_range():
    assert cover([7], 16) == [(7, 7)]


def test_consecutive_keys_stay_one_range_however_many_are_allowed():
    assert cover(list(range(100, 200)), 16) == [(100, 199)]


def test_split_at_the_widest_gaps():
    # Deletes of the oldest rows, updates among the newest, inserts above them.
    keys = [1, 2, 3, 500, 501, 503, 1000, 1001]
    assert cover(keys, 3) == [(1, 3), (500, 503), (1000, 1001)]
    assert cover(keys, 2) == [(1, 3), (500, 1001)]
    assert cover(keys, 1) == [(1, 1001)]


def test_every_key_is_covered_and_no_range_is_wasted():
    rng = random.Random(3)
    for _ in range(200):
        keys = sorted(set(rng.sample(range(-1000, 1000), rng.randint(1, 60))))
        most = rng.randint(1, 20)
        ranges = cover(keys, most)
        assert 1 <= len(ranges) <= most
        assert all(any(low <= k <= high for low, high in ranges) for k in keys)
        assert all(low in keys and high in keys for low, high in ranges)
        assert all(a[1] + 1 < b[0] for a, b in zip(ranges, ranges[1:]))  # disjoint, not adjacent, in order
        # The fewest integers outside the keys: the widest gaps are the ones left out.
        gaps = sorted((b - a - 1 for a, b in zip(keys, keys[1:])), reverse=True)
        outside = sum(high - low + 1 for low, high in ranges) - len(keys)
        assert outside == sum(gaps[most - 1:])
