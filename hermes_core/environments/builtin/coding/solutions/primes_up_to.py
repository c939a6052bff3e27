def primes_up_to(n: int) -> list:
    if n < 2:
        return []
    sieve = bytearray([1]) * (n + 1)
    sieve[0] = sieve[1] = 0
    for candidate in range(2, int(n ** 0.5) + 1):
        if sieve[candidate]:
            sieve[candidate * candidate::candidate] = bytearray(len(range(candidate * candidate, n + 1, candidate)))
    return [number for number, flag in enumerate(sieve) if flag]
