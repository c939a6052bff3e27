from solution import count_grid_paths


def test_open_grid():
    assert count_grid_paths([[0, 0, 0], [0, 0, 0], [0, 0, 0]]) == 6


def test_obstacles():
    assert count_grid_paths([[0, 0, 0], [0, 1, 0], [0, 0, 0]]) == 2
    assert count_grid_paths([[0, 1], [1, 0]]) == 0


def test_blocked_start_or_end():
    assert count_grid_paths([[1, 0], [0, 0]]) == 0
    assert count_grid_paths([[0, 0], [0, 1]]) == 0


def test_single_cell_and_empty_grid():
    assert count_grid_paths([[0]]) == 1
    assert count_grid_paths([]) == 0


def test_large_grid_is_fast():
    assert count_grid_paths([[0] * 18 for _ in range(18)]) == 2333606220
