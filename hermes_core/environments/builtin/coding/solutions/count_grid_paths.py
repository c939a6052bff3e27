def count_grid_paths(grid: list) -> int:
    if not grid or not grid[0]:
        return 0
    width = len(grid[0])
    ways = [0] * width
    for row_index, row in enumerate(grid):
        for col, cell in enumerate(row):
            if cell == 1:
                ways[col] = 0
            elif row_index == 0 and col == 0:
                ways[col] = 1
            elif col > 0:
                ways[col] += ways[col - 1]
    return ways[-1]
