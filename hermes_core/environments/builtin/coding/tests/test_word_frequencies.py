from solution import word_frequencies


def test_counts_lowercased_words():
    assert word_frequencies("The cat and the hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}


def test_non_letters_separate_words():
    assert word_frequencies("don't stop-stop, 42times!") == {"don": 1, "t": 1, "stop": 2, "times": 1}


def test_empty_or_no_words():
    assert word_frequencies("") == {}
    assert word_frequencies("123 ... !!") == {}


def test_mixed_case_is_one_word():
    assert word_frequencies("Go GO go gO") == {"go": 4}
