from solution import get_path

DATA = {"a": {"b": [10, {"c": "deep"}]}, "name": "hermes", "none": None}


def test_dict_keys_and_list_indexes():
    assert get_path(DATA, "name") == "hermes"
    assert get_path(DATA, "a.b.0") == 10
    assert get_path(DATA, "a.b.1.c") == "deep"


def test_missing_gives_the_default():
    assert get_path(DATA, "a.x") is None
    assert get_path(DATA, "a.b.5", default="missing") == "missing"
    assert get_path(DATA, "a.b.first", default=0) == 0
    assert get_path(DATA, "name.length", default=-1) == -1


def test_empty_path_is_the_data():
    assert get_path(DATA, "") is DATA


def test_a_stored_none_is_returned_not_the_default():
    assert get_path(DATA, "none", default="d") is None
