from solution import lcm_of


def test_two_numbers():
    assert lcm_of([4, 6]) == 12


def test_one_to_ten():
    assert lcm_of(list(range(1, 11))) == 2520


def test_single_and_empty():
    assert lcm_of([7]) == 7
    assert lcm_of([]) == 1


def test_large_numbers_are_exact():
    assert lcm_of([2 ** 40, 3 ** 20, 2 ** 10]) == 2 ** 40 * 3 ** 20
