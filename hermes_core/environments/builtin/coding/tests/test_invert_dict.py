from solution import invert_dict


def test_unique_values():
    assert invert_dict({"a": 1, "b": 2}) == {1: ["a"], 2: ["b"]}


def test_shared_values_keep_key_order():
    assert invert_dict({"x": "red", "y": "blue", "z": "red"}) == {"red": ["x", "z"], "blue": ["y"]}


def test_empty():
    assert invert_dict({}) == {}


def test_input_not_modified():
    mapping = {1: "a", 2: "a"}
    assert invert_dict(mapping) == {"a": [1, 2]}
    assert mapping == {1: "a", 2: "a"}
