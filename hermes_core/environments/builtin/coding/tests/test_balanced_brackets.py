from solution import balanced_brackets


def test_balanced():
    assert balanced_brackets("([]{})") is True
    assert balanced_brackets("f(a[1], {b: 2})") is True


def test_empty_and_no_brackets():
    assert balanced_brackets("") is True
    assert balanced_brackets("hello") is True


def test_wrong_nesting():
    assert balanced_brackets("([)]") is False


def test_unclosed_or_unopened():
    assert balanced_brackets("((") is False
    assert balanced_brackets(")(") is False
    assert balanced_brackets("a}") is False
