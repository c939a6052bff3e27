import datetime


def add_business_days(start: str, days: int) -> str:
    if days < 0:
        raise ValueError("days must not be negative")
    current = datetime.date.fromisoformat(start)
    while days:
        current += datetime.timedelta(days=1)
        if current.weekday() < 5:
            days -= 1
    return current.isoformat()
