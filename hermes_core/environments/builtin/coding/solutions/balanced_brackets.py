PAIRS = {")": "(", "]": "[", "}": "{"}


def balanced_brackets(text: str) -> bool:
    stack = []
    for char in text:
        if char in "([{":
            stack.append(char)
        elif char in PAIRS:
            if not stack or stack.pop() != PAIRS[char]:
                return False
    return not stack
