import pytest

from solution import moving_average


def test_window_of_three():
    assert moving_average([1, 2, 3, 4, 5], 3) == pytest.approx([2.0, 3.0, 4.0])


def test_window_of_one_and_full_length():
    assert moving_average([4, 8], 1) == pytest.approx([4.0, 8.0])
    assert moving_average([1.5, 2.5, 3.5], 3) == pytest.approx([2.5])


def test_window_longer_than_the_values():
    assert moving_average([1, 2], 3) == []
    assert moving_average([], 1) == []


def test_window_below_one_is_rejected():
    with pytest.raises(ValueError):
        moving_average([1, 2, 3], 0)
