import pytest

from solution import add_business_days


def test_within_a_week():
    assert add_business_days("2024-03-04", 3) == "2024-03-07"  # Monday -> Thursday


def test_skips_the_weekend():
    assert add_business_days("2024-03-01", 1) == "2024-03-04"  # Friday -> Monday
    assert add_business_days("2024-03-01", 6) == "2024-03-11"


def test_zero_days_returns_the_start():
    assert add_business_days("2024-03-02", 0) == "2024-03-02"  # even a Saturday


def test_start_on_a_weekend():
    assert add_business_days("2024-03-02", 1) == "2024-03-04"  # Saturday -> Monday


def test_across_years_and_negative_days():
    assert add_business_days("2024-12-31", 3) == "2025-01-03"
    with pytest.raises(ValueError):
        add_business_days("2024-03-04", -1)
