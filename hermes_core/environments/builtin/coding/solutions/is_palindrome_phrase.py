def is_palindrome_phrase(text: str) -> bool:
    kept = [char.lower() for char in text if char.isalnum()]
    return kept == kept[::-1]
