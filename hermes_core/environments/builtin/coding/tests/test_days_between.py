import pytest

from solution import days_between


def test_same_month_and_same_day():
    assert days_between("2024-01-01", "2024-01-31") == 30
    assert days_between("2024-05-05", "2024-05-05") == 0


def test_leap_years():
    assert days_between("2024-02-28", "2024-03-01") == 2
    assert days_between("2023-02-28", "2023-03-01") == 1


def test_end_before_start_is_negative():
    assert days_between("2024-01-10", "2024-01-01") == -9


def test_long_span():
    assert days_between("2000-01-01", "2100-01-01") == 36525


def test_invalid_dates_are_rejected():
    with pytest.raises(ValueError):
        days_between("2023-02-30", "2023-03-01")
    with pytest.raises(ValueError):
        days_between("2023-01-01", "not a date")
