def spiral_order(matrix: list) -> list:
    result = []
    rows = [list(row) for row in matrix]
    while rows and rows[0]:
        result.extend(rows.pop(0))
        if rows and rows[0]:
            for row in rows:
                result.append(row.pop())
        if rows:
            result.extend(reversed(rows.pop()))
        if rows and rows[0]:
            for row in reversed(rows):
                result.append(row.pop(0))
    return result
