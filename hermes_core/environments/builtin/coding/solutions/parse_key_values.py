def parse_key_values(text: str) -> dict:
    result: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "=" not in stripped:
            raise ValueError(f"line {number}: no '='")
        key, value = stripped.split("=", 1)
        key = key.strip()
        if not key:
            raise ValueError(f"line {number}: empty key")
        result[key] = value.strip()
    return result
