import pytest

from solution import parse_duration


def test_single_units():
    assert parse_duration("45s") == 45
    assert parse_duration("2m") == 120
    assert parse_duration("1d") == 86400


def test_combined_units():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d 3h") == 183600


def test_whitespace_allowed_around_and_between_parts():
    assert parse_duration("  1m   1s ") == 61


def test_invalid_text_is_rejected():
    for text in ("", "   ", "10", "5x", "h", "1.5h", "-1s"):
        with pytest.raises(ValueError):
            parse_duration(text)
