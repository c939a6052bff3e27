import pytest

from solution import roman_to_int


def test_single_symbols():
    assert [roman_to_int(s) for s in "IVXLCDM"] == [1, 5, 10, 50, 100, 500, 1000]


def test_additive_and_subtractive():
    assert roman_to_int("III") == 3
    assert roman_to_int("IV") == 4
    assert roman_to_int("XLII") == 42
    assert roman_to_int("CMXC") == 990


def test_long_numerals():
    assert roman_to_int("MCMXCIV") == 1994
    assert roman_to_int("MMMCMXCIX") == 3999


def test_invalid_input_is_rejected():
    for text in ("", "ABC", "xiv", "X I"):
        with pytest.raises(ValueError):
            roman_to_int(text)
