import copy

from solution import deep_merge


def test_flat_override_wins():
    assert deep_merge({"a": 1, "b": 2}, {"b": 3, "c": 4}) == {"a": 1, "b": 3, "c": 4}


def test_nested_dicts_merge():
    base = {"db": {"host": "localhost", "port": 5432}, "debug": False}
    override = {"db": {"port": 6543, "user": "admin"}}
    assert deep_merge(base, override) == {"db": {"host": "localhost", "port": 6543, "user": "admin"}, "debug": False}


def test_non_dict_replaces_dict_and_back():
    assert deep_merge({"a": {"x": 1}}, {"a": 5}) == {"a": 5}
    assert deep_merge({"a": 5}, {"a": {"x": 1}}) == {"a": {"x": 1}}


def test_inputs_are_not_modified():
    base = {"a": {"b": {"c": 1}}, "l": [1]}
    override = {"a": {"b": {"d": 2}}}
    before = (copy.deepcopy(base), copy.deepcopy(override))
    merged = deep_merge(base, override)
    assert merged == {"a": {"b": {"c": 1, "d": 2}}, "l": [1]}
    assert (base, override) == before


def test_empty_dicts():
    assert deep_merge({}, {}) == {}
    assert deep_merge({"a": {}}, {}) == {"a": {}}
