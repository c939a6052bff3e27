import pytest

from solution import parse_key_values


def test_pairs_with_whitespace_trimmed():
    assert parse_key_values("name = hermes\n  port=8080  \n") == {"name": "hermes", "port": "8080"}


def test_comments_and_blank_lines_are_ignored():
    text = "# settings\n\n   \n  # indented comment\nmode = fast\n"
    assert parse_key_values(text) == {"mode": "fast"}


def test_value_may_hold_equals_and_later_keys_win():
    assert parse_key_values("url = a=b\nx = 1\nx = 2") == {"url": "a=b", "x": "2"}


def test_empty_value_is_allowed():
    assert parse_key_values("empty =") == {"empty": ""}


def test_bad_lines_are_rejected():
    with pytest.raises(ValueError):
        parse_key_values("ok = 1\nno equals here\n")
    with pytest.raises(ValueError):
        parse_key_values(" = value")
