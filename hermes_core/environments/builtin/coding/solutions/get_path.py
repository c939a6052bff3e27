def get_path(data, path: str, default=None):
    if path == "":
        return data
    current = data
    for segment in path.split("."):
        if isinstance(current, dict):
            if segment not in current:
                return default
            current = current[segment]
        elif isinstance(current, list):
            if not segment.isdigit() or int(segment) >= len(current):
                return default
            current = current[int(segment)]
        else:
            return default
    return current
