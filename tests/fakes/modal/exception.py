"""The exceptions of the fake Modal SDK: the names (and bases) of `modal.exception` the backend uses."""


class Error(Exception):
    """Base of every Modal error."""


class AuthError(Error):
    """No or invalid credentials."""


class ConnectionError(Error):  # noqa: A001  (the real SDK shadows the builtin too)
    """The Modal server could not be reached."""


class NotFoundError(Error):
    pass


class InvalidError(Error):
    pass


class TimeoutError(Error):  # noqa: A001
    pass


class ExecTimeoutError(TimeoutError):
    pass


class SandboxTerminatedError(Error):
    pass


class SandboxFilesystemError(Error):
    pass


class SandboxFilesystemNotFoundError(SandboxFilesystemError):
    pass


class SandboxFilesystemIsADirectoryError(SandboxFilesystemError):
    pass
