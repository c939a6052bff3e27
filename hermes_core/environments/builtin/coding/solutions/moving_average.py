def moving_average(values: list, window: int) -> list:
    if window < 1:
        raise ValueError("window must be at least 1")
    if window > len(values):
        return []
    total = sum(values[:window])
    result = [total / window]
    for index in range(window, len(values)):
        total += values[index] - values[index - window]
        result.append(total / window)
    return result
