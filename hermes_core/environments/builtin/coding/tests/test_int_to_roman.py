import pytest

from solution import int_to_roman


def test_basic_numerals():
    assert [int_to_roman(n) for n in (1, 3, 5, 10, 50, 100, 500, 1000)] == ["I", "III", "V", "X", "L", "C", "D", "M"]


def test_subtractive_forms():
    assert [int_to_roman(n) for n in (4, 9, 40, 90, 400, 900)] == ["IV", "IX", "XL", "XC", "CD", "CM"]


def test_composite_numbers():
    assert int_to_roman(1994) == "MCMXCIV"
    assert int_to_roman(2024) == "MMXXIV"
    assert int_to_roman(3999) == "MMMCMXCIX"


def test_out_of_range_is_rejected():
    for n in (0, -1, 4000):
        with pytest.raises(ValueError):
            int_to_roman(n)
