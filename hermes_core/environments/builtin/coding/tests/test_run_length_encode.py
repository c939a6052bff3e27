from solution import run_length_encode


def test_runs_become_count_and_character():
    assert run_length_encode("aaabcc") == "3a1b2c"


def test_empty_text():
    assert run_length_encode("") == ""


def test_long_runs_use_multi_digit_counts():
    assert run_length_encode("x" * 12 + "y") == "12x1y"


def test_case_sensitive_and_any_character():
    assert run_length_encode("aA  !") == "1a1A2 1!"


def test_same_character_again_later_is_a_new_run():
    assert run_length_encode("abba") == "1a2b1a"
