from solution import rotate_right


def test_rotates_right():
    assert rotate_right([1, 2, 3, 4, 5], 2) == [4, 5, 1, 2, 3]


def test_negative_rotates_left():
    assert rotate_right([1, 2, 3, 4, 5], -1) == [2, 3, 4, 5, 1]


def test_k_larger_than_the_length():
    assert rotate_right([1, 2, 3], 7) == [3, 1, 2]
    assert rotate_right([1, 2, 3], 3) == [1, 2, 3]


def test_empty_list():
    assert rotate_right([], 4) == []


def test_returns_a_new_list():
    items = ["a", "b", "c"]
    result = rotate_right(items, 1)
    assert items == ["a", "b", "c"] and result == ["c", "a", "b"]
