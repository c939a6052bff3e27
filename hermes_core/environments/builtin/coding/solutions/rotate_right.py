def rotate_right(items: list, k: int) -> list:
    if not items:
        return []
    k %= len(items)
    return items[len(items) - k:] + items[:len(items) - k]
