from solution import hanoi_moves


def test_small_towers():
    assert hanoi_moves(0) == []
    assert hanoi_moves(1) == [("A", "C")]
    assert hanoi_moves(2) == [("A", "B"), ("A", "C"), ("B", "C")]


def test_move_count():
    assert len(hanoi_moves(10)) == 2 ** 10 - 1


def test_moves_are_legal_and_solve_the_puzzle():
    n = 6
    pegs = {"A": list(range(n, 0, -1)), "B": [], "C": []}
    for source, target in hanoi_moves(n):
        disk = pegs[source].pop()
        assert not pegs[target] or pegs[target][-1] > disk
        pegs[target].append(disk)
    assert pegs == {"A": [], "B": [], "C": list(range(n, 0, -1))}
