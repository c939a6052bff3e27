from solution import caesar_shift


def test_simple_shift_and_wrap_around():
    assert caesar_shift("abc", 1) == "bcd"
    assert caesar_shift("xyz", 3) == "abc"


def test_case_kept_and_other_characters_unchanged():
    assert caesar_shift("Hello, World!", 13) == "Uryyb, Jbeyq!"


def test_negative_shift():
    assert caesar_shift("abc", -1) == "zab"
    assert caesar_shift("Bcd", -27) == "Abc"


def test_shift_larger_than_the_alphabet():
    assert caesar_shift("abc", 53) == "bcd"


def test_non_ascii_letters_are_not_shifted():
    assert caesar_shift("café 9", 1) == "dbgé 9"
