import pytest

from solution import chunk_list


def test_even_chunks():
    assert chunk_list([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_last_chunk_may_be_shorter():
    assert chunk_list([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunk_list(["a", "b"], 5) == [["a", "b"]]


def test_empty_list():
    assert chunk_list([], 3) == []


def test_input_not_modified():
    items = [1, 2, 3]
    chunk_list(items, 1)
    assert items == [1, 2, 3]


def test_size_below_one_is_rejected():
    with pytest.raises(ValueError):
        chunk_list([1, 2], 0)
    with pytest.raises(ValueError):
        chunk_list([1, 2], -1)
