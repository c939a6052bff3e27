import pytest

from solution import format_duration


def test_all_units():
    assert format_duration(90061) == "1d 1h 1m 1s"


def test_zero_parts_are_left_out():
    assert format_duration(3600) == "1h"
    assert format_duration(2 * 86400 + 5) == "2d 5s"
    assert format_duration(59) == "59s"


def test_zero_seconds():
    assert format_duration(0) == "0s"


def test_large_day_counts():
    assert format_duration(400 * 86400 + 120) == "400d 2m"


def test_negative_is_rejected():
    with pytest.raises(ValueError):
        format_duration(-1)
