from solution import primes_up_to


def test_small_limits():
    assert primes_up_to(10) == [2, 3, 5, 7]
    assert primes_up_to(2) == [2]


def test_limit_is_inclusive():
    assert primes_up_to(97)[-1] == 97
    assert primes_up_to(30) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]


def test_below_two_is_empty():
    assert primes_up_to(1) == []
    assert primes_up_to(0) == []
    assert primes_up_to(-5) == []


def test_count_up_to_ten_thousand():
    assert len(primes_up_to(10000)) == 1229
