from solution import flatten


def test_nested_lists():
    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]


def test_empty_lists_vanish():
    assert flatten([]) == []
    assert flatten([[], [[]], [[], [1]]]) == [1]


def test_only_lists_are_flattened():
    assert flatten([(1, 2), "ab", [3, {"k": 4}]]) == [(1, 2), "ab", 3, {"k": 4}]


def test_deep_nesting():
    nested = [0]
    for number in range(1, 100):
        nested = [nested, number]
    assert flatten(nested) == list(range(100))
