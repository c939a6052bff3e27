import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> int:
    if not re.fullmatch(r"\s*(?:\d+[dhms]\s*)+", text):
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(amount) * UNITS[unit] for amount, unit in re.findall(r"(\d+)([dhms])", text))
