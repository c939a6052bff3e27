from math import gcd


def lcm_of(numbers: list) -> int:
    result = 1
    for number in numbers:
        result = result * number // gcd(result, number)
    return result
