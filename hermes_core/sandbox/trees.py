"""Removing what sandboxes wrote on the host (session folders, workspaces), whatever a command made
of it: any depth (no recursion, and below the top only single names are looked up, so PATH_MAX does
not matter), folders made unreadable or read-only (made accessible again), links (removed, never
followed), mounts (never entered) and few free file descriptors (at most four open at a time).
What cannot be removed is skipped and reported in one warning: a leftover never stops the clean-up
of anything else, and a later clean-up tries again."""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SHOWN_CHARS = 160  # a 1,200-deep path has thousands of characters: the warning shows its ends


def remove_tree(path: Path | str) -> int:
    """Remove `path` (a folder tree, a file or a link) and never raise; returns how many entries
    stayed (0: all gone), after logging one warning naming `path` if any did."""
    top = os.path.abspath(path)
    parent, name = os.path.split(top)
    try:
        parent_fd = os.open(parent, _FOLDER)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        removal = _Removal(parent, -1)
        removal.stayed(name, exc)
    else:
        try:
            removal = _Removal(os.path.realpath(parent), parent_fd)
            removal.run(name)
        finally:
            os.close(parent_fd)
    if removal.left:
        log.warning("could not remove all of %s: %d entr%s stayed, the first %s; skipped (a later clean-up "
                    "tries again)", top, removal.left, "y" if removal.left == 1 else "ies", removal.first)
    return removal.left


@dataclass
class _Folder:
    """A folder being emptied: `entries` are its (name, is a folder) still to remove."""

    name: str
    ident: tuple[int, int]  # (st_dev, st_ino): `..` of a child must lead back to exactly this folder
    entries: list[tuple[str, bool]]
    kept: bool = False  # something inside stayed, so this folder stays too


class _Removal:
    """One tree's removal, depth first with an explicit stack of folders; only the deepest is open,
    and the way back up is its `..`, checked to be the folder it was entered from."""

    def __init__(self, parent: str, parent_fd: int) -> None:
        self.parent, self.parent_fd = parent, parent_fd  # the real path of the tree's parent, open
        self.stack: list[_Folder] = []
        self.fd = -1  # the deepest folder of the stack
        self.mounts: set[str] = set()  # real paths of mount points in the tree: never entered
        self.left, self.first = 0, ""

    def path(self, name: str) -> str:
        return "/".join([self.parent.rstrip("/"), *(folder.name for folder in self.stack), name])

    def stayed(self, name: str, why: OSError | str) -> None:
        self.left += 1
        if self.left == 1:
            where = self.path(name)
            if len(where) > _SHOWN_CHARS:
                where = f"{where[:_SHOWN_CHARS // 2]}…{where[-_SHOWN_CHARS // 2:]}"
            self.first = f"{where}: {(why.strerror or str(why)) if isinstance(why, OSError) else why}"

    def run(self, name: str) -> None:
        try:
            info = os.stat(name, dir_fd=self.parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.stayed(name, exc)
            return
        if not stat.S_ISDIR(info.st_mode):
            self._remove(self.parent_fd, name)
            return
        self.mounts = _mount_points(self.path(name))
        if not self._enter(self.parent_fd, name):
            return
        try:
            while self.stack:
                folder = self.stack[-1]
                if not folder.entries:
                    self._leave()
                    continue
                child, is_folder = folder.entries.pop()
                if not (self._enter(self.fd, child) if is_folder else self._remove(self.fd, child)):
                    folder.kept = True
        finally:
            if self.fd >= 0:
                os.close(self.fd)

    def _enter(self, dir_fd: int, name: str) -> bool:
        """Open the folder `name` of `dir_fd` (the deepest open one, which is closed then), list it and
        make it accessible; False (reported) when it stays."""
        if self.mounts and self.path(name) in self.mounts:
            self.stayed(name, "a mount point (not entered)")
            return False
        try:
            fd = _open_folder(dir_fd, name)
        except OSError as exc:
            self.stayed(name, exc)
            return False
        try:
            info = os.fstat(fd)
            if info.st_mode & 0o700 != 0o700:  # a command made it read-only: its entries could not go
                _ignore_errors(os.fchmod, fd, stat.S_IMODE(info.st_mode) | 0o700)
            with os.scandir(fd) as listing:
                entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
        except OSError as exc:
            os.close(fd)
            self.stayed(name, exc)
            return False
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = fd
        self.stack.append(_Folder(name, (info.st_dev, info.st_ino), entries))
        return True

    def _leave(self) -> None:
        """Go up from the emptied deepest folder and remove it (unless something in it stayed)."""
        done = self.stack.pop()
        if not self.stack:
            os.close(self.fd)
            self.fd = -1
            if not done.kept:
                self._remove(self.parent_fd, done.name, folder=True)
            return
        up, why = -1, ""
        try:
            up = os.open("..", _FOLDER, dir_fd=self.fd)
            info = os.fstat(up)
            if (info.st_dev, info.st_ino) != self.stack[-1].ident:
                why = "moved while it was removed"
        except OSError as exc:
            why = f"cannot go back up: {exc.strerror or exc}"
        finally:
            os.close(self.fd)
            self.fd = up
        if why:  # nothing above may be touched: it is not known where `..` leads
            self.stayed(done.name, why)
            self.stack.clear()
        elif done.kept or not self._remove(up, done.name, folder=True):
            self.stack[-1].kept = True

    def _remove(self, dir_fd: int, name: str, folder: bool = False) -> bool:
        """Unlink `name` of `dir_fd` (rmdir a `folder`); whether it is gone (reported if not)."""
        try:
            (os.rmdir if folder else os.unlink)(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.stayed(name, exc)
            return False
        return True


def _open_folder(dir_fd: int, name: str) -> int:
    """The folder `name` of `dir_fd` opened (never through a link); made readable first if need be."""
    try:
        return os.open(name, _FOLDER, dir_fd=dir_fd)
    except PermissionError:  # e.g. mode 000: allowed to its owner, and without following a link
        _ignore_errors(os.chmod, name, 0o700, dir_fd=dir_fd, follow_symlinks=False)
        return os.open(name, _FOLDER, dir_fd=dir_fd)


def _ignore_errors(func, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
    """A best effort: if it fails, what it was for fails next and is reported then."""
    try:
        func(*args, **kwargs)
    except (OSError, ValueError, NotImplementedError):  # chmod of a link: NotImplementedError on Linux
        pass


def _mount_points(top: str) -> set[str]:
    """The mount points at or below the real path `top` (mountinfo's field 5, octal escapes decoded)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as mountinfo:
            lines = mountinfo.read().splitlines()
    except OSError:
        return set()
    found = {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split(" ")[4]) for line in lines
             if len(line.split(" ")) > 4}
    return {point for point in found if point == top or point.startswith(top.rstrip("/") + "/")}
