def hanoi_moves(n: int, source: str = "A", target: str = "C", spare: str = "B") -> list:
    if n <= 0:
        return []
    return (hanoi_moves(n - 1, source, spare, target) + [(source, target)]
            + hanoi_moves(n - 1, spare, target, source))
