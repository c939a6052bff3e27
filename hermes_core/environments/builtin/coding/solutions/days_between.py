import datetime


def days_between(start: str, end: str) -> int:
    first = datetime.datetime.strptime(start, "%Y-%m-%d").date()
    last = datetime.datetime.strptime(end, "%Y-%m-%d").date()
    return (last - first).days
