from solution import is_palindrome_phrase


def test_ignores_case_punctuation_and_spaces():
    assert is_palindrome_phrase("A man, a plan, a canal: Panama") is True
    assert is_palindrome_phrase("No 'x' in Nixon") is True


def test_not_a_palindrome():
    assert is_palindrome_phrase("race a car") is False
    assert is_palindrome_phrase("ab") is False


def test_digits_count():
    assert is_palindrome_phrase("12321") is True
    assert is_palindrome_phrase("1a2") is False


def test_nothing_alphanumeric_is_a_palindrome():
    assert is_palindrome_phrase("") is True
    assert is_palindrome_phrase(" ,.!") is True
