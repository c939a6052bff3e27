"""A fake `modal` SDK for tests (put tests/fakes first on sys.path): the few names the modal backend
uses, with the real SDK's parameter names, running sandboxes for real in bubblewrap on this machine.
Cloud-side knobs: `modal._cloud.configure(root=..., authenticated=..., offline=...)`."""

from modal import exception
from modal.app import App
from modal.image import Image
from modal.sandbox import Sandbox

__version__ = "1.6.4+fake"
__all__ = ["App", "Image", "Sandbox", "exception"]
