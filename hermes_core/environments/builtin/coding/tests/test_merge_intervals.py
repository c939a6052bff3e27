from solution import merge_intervals


def test_overlapping_intervals_merge():
    assert merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]


def test_touching_intervals_merge():
    assert merge_intervals([(1, 3), (3, 5)]) == [(1, 5)]


def test_unsorted_input_and_contained_intervals():
    assert merge_intervals([(5, 7), (1, 10), (12, 12), (2, 3)]) == [(1, 10), (12, 12)]


def test_empty_input():
    assert merge_intervals([]) == []


def test_disjoint_intervals_sorted():
    assert merge_intervals([(4, 5), (0, 1)]) == [(0, 1), (4, 5)]
