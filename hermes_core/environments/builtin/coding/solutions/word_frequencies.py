import re


def word_frequencies(text: str) -> dict:
    counts: dict[str, int] = {}
    for word in re.findall(r"[A-Za-z]+", text):
        word = word.lower()
        counts[word] = counts.get(word, 0) + 1
    return counts
