SYMBOLS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_to_int(s: str) -> int:
    if not s or any(char not in SYMBOLS for char in s):
        raise ValueError(f"not a Roman numeral: {s!r}")
    total = 0
    for index, char in enumerate(s):
        value = SYMBOLS[char]
        if index + 1 < len(s) and SYMBOLS[s[index + 1]] > value:
            total -= value
        else:
            total += value
    return total
