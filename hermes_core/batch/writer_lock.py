"""One writer per run: a second process on a run that is running is refused at once, naming the holder.

Two processes running the same samples pay for each of them twice, and race on the run's files. So a
process that runs samples of a run holds the run's writer lock from before its first model call to its
end, and a process that cannot get it stops with `RunBusy` (pid, host, since when, command):

- In the run folder, `.writer/run.lock` is `flock`ed: exclusively for a whole run (`hermes-batch`, a
  Dagster step over several batches), shared by a step that runs one batch, which also locks
  `.writer/<batch>.lock` exclusively. So the sensor's one-run-per-batch steps run side by side, while
  a second `hermes-batch`, or a second step on a batch, is refused.
- `.writer/<token>.holder` says who holds what. Its holder `flock`s it for as long as it holds
  anything, so a refused process names live holders only, never one that crashed.
- The kernel drops a dead process's flocks (kill -9 included): a crashed run never blocks the next.
- Holds are per process and counted: the CLI holds the whole run for its life, and the Dagster steps
  it runs in the same process enter and leave inside that hold.
- With the ledger on object storage, another machine may run the same run, so the holder also keeps
  a lease object `<ledger url>/.writer/<token>.lease` (holder, scope, expiry) that a heartbeat thread
  renews. A live lease of another holder with an overlapping scope refuses the run; one that lapsed,
  or whose holder ran on this machine and is gone, is taken over. Stores have no compare-and-swap, so
  a holder writes its lease, then looks again: of two started at the same moment, at least the later
  one sees the other and backs off, and they never both run.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from hermes_core.config import ledger_location
from hermes_core.fileio import json_bytes, json_loads, report_damage
from hermes_core.sandbox.processes import process_start_time

FOLDER = ".writer"  # in the run folder, and under the ledger URL
LEASE_TTL_S = 30.0  # a lease not renewed for this long belongs to a dead holder
RENEW_EVERY_S = 10.0
REFUSAL_RETRIES = 5  # a holder between taking its locks and saying who it is, or just leaving
SECRET_WORD = re.compile(r"key|secret|password|passwd|token(?!s)", re.IGNORECASE)
URL_USER = re.compile(r"//[^/@\s]+@")


class RunBusy(RuntimeError):
    """Another process is running this run: running it as well would pay for its samples twice."""


def _command() -> str:
    """This process's command line as a holder shows it: secrets (--api_key=…, …_TOKEN=…, a URL's
    user:password@) masked, and serialized payloads elided (`dagster api execute_run {…}` carries the
    instance's settings, credentials included)."""
    words, secret_next = [os.path.basename(sys.argv[0]) if sys.argv else "python"], False
    for word in sys.argv[1:]:
        name, equals, _ = word.partition("=")
        if secret_next:
            shown = "***"
        elif word.startswith(("{", "[")):
            shown = word[0] + "…"
        elif equals and SECRET_WORD.search(name):
            shown = f"{name}=***"
        else:
            shown = URL_USER.sub("//***@", word)
        secret_next = word.startswith("-") and not equals and bool(SECRET_WORD.search(word))
        words.append(shown)
    command = " ".join(words)
    return command if len(command) <= 300 else command[:299] + "…"


def _identity() -> dict[str, Any]:
    """This process as another one on the same kernel and pid namespace can check it is still alive."""
    try:
        return {"boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                "pid_ns": os.stat("/proc/self/ns/pid").st_ino, "start_ticks": process_start_time(os.getpid())}
    except OSError:
        return {}


def _gone(holder: dict[str, Any]) -> bool:
    """Whether a lease's holder is known to be dead: it ran on this machine, in this pid namespace,
    and its process is no more. Then its lease need not lapse first (a resume after kill -9)."""
    mine, theirs = _identity(), holder.get("process") or {}
    return bool(mine) and all(theirs.get(key) == mine[key] for key in ("boot_id", "pid_ns")) and \
        process_start_time(int(holder["pid"])) != theirs.get("start_ticks")


def _overlaps(one: list[str] | None, other: list[str] | None) -> bool:
    """Whether two holds' scopes (None: the whole run; else its batches) share a sample."""
    return one is None or other is None or not set(one).isdisjoint(other)


def describe(run_name: str, holder: dict[str, Any], more: int = 0, note: str = "") -> str:
    """One line naming a holder of `run_name` and what to do about it."""
    batches = holder.get("batches")
    scope = "the whole run" if batches is None else (
        f"batch {batches[0]}" if len(batches) == 1 else f"{len(batches)} batches ({batches[0]}, …)")
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["since"]))
    others = f" (and {more} other process(es))" if more else ""
    return (f"run {run_name!r} is already running: pid {holder['pid']} on {holder['host']} has held "
            f"{scope} since {since} ({max(0, round(time.time() - holder['since']))} s ago){others}, command: "
            f"{holder['command']}{note}. A second process would pay for the same samples twice: wait for it to "
            "finish or stop it, then run the same command to resume")


class Lease:
    """A holder's lease on object storage, renewed by a heartbeat thread until `release()`."""

    def __init__(self, url: str, holder: dict[str, Any]) -> None:
        from fsspec.core import url_to_fs  # fsspec and its backends only when the ledger is there

        self.url = f"{url.rstrip('/')}/{FOLDER}"
        self.fs, self.prefix = url_to_fs(self.url)
        self.path = f"{self.prefix}/{holder['token']}.lease"
        self.holder = holder
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _write(self) -> None:
        """(Re)write this holder's lease with a fresh expiry."""
        self.fs.pipe_file(self.path, json_bytes({**self.holder, "expires": time.time() + LEASE_TTL_S}))

    def others(self) -> list[dict[str, Any]]:
        """Live leases of other holders whose scope overlaps this one's; expired ones are removed."""
        self.fs.invalidate_cache()  # listings are cached: other holders write
        names = [name for name in self.fs.find(self.prefix) if name.endswith(".lease") and name != self.path]
        live = []
        for name, data in (self.fs.cat(names, on_error="omit") if names else {}).items():
            try:
                lease = json_loads(data)
            except ValueError:
                continue  # not ours to read: never blocks a run
            if lease.get("expires", 0) > time.time() and not _gone(lease):
                if _overlaps(lease.get("batches"), self.holder["batches"]):
                    live.append(lease)
                continue
            try:  # taken over: its holder died, or stopped renewing it
                self.fs.rm(name)
            except FileNotFoundError:
                pass
        return sorted(live, key=lambda lease: lease["since"])

    def acquire(self) -> "Lease":
        """Take the lease, or raise RunBusy naming a live holder."""
        live = self.others()
        if not live:
            self._write()
            live = self.others()  # one that began at the same moment: at least one of us sees the other
            if live:
                self.fs.rm(self.path)
        if live:
            raise RunBusy(describe(self.holder["run"], live[0], len(live) - 1, f" (its lease in {self.url} "
                                   f"lapses {LEASE_TTL_S:g} s after its holder stops renewing it)"))
        self._heartbeat = threading.Thread(target=self._renew, name="hermes-writer-lease", daemon=True)
        self._heartbeat.start()
        return self

    def _renew(self) -> None:
        """The heartbeat: renew the lease until `release()`."""
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                self._write()
            except Exception as exc:  # a store hiccup: the next beat tries again, well within the lease
                report_damage(f"{self.path}: could not renew the run's writer lease ({exc})")

    def release(self) -> None:
        """Stop the heartbeat and remove the lease."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        try:
            self.fs.rm(self.path)
        except FileNotFoundError:
            pass


class Hold:
    """What this process holds of one run: flocks in its folder, and a lease when its ledger is on
    object storage. `release()` gives it up once every holder in the process has released it."""

    def __init__(self, run_root: Path, batches: list[str] | None) -> None:
        self.run_root, self.folder = run_root, run_root / FOLDER
        self.holder = {"run": run_root.name, "token": uuid.uuid4().hex[:16], "pid": os.getpid(),
                       "host": socket.gethostname(), "since": time.time(), "command": _command(), "batches": batches,
                       "process": _identity()}
        self._holder_file = self.folder / f"{self.holder['token']}.holder"
        self.count = 0
        self._fds: list[int] = []
        self._lease: Lease | None = None

    def _flock(self, name: str, mode: int) -> int:
        """Lock `.writer/<name>` (created if need be) without waiting; BlockingIOError if someone holds it."""
        fd = os.open(self.folder / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise
        self._fds.append(fd)
        return fd

    def acquire(self) -> "Hold":
        """Take the run (or its batches), or raise RunBusy naming a live holder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            # Who we are first, locked until the end, so a refused process names only live holders;
            # locked before it takes its name, so no one takes it for a dead holder's file.
            me = self._flock(f".{self.holder['token']}.new", fcntl.LOCK_EX)
            os.rename(self.folder / f".{self.holder['token']}.new", self._holder_file)
            for attempt in range(REFUSAL_RETRIES):
                try:
                    self._flock("run.lock", fcntl.LOCK_EX if self.holder["batches"] is None else fcntl.LOCK_SH)
                    for batch in self.holder["batches"] or ():
                        self._flock(f"{batch}.lock", fcntl.LOCK_EX)
                    break
                except BlockingIOError:
                    for fd in self._fds[1:]:
                        os.close(fd)
                    del self._fds[1:]
                    live = self._live_holders()
                    if live or attempt == REFUSAL_RETRIES - 1:
                        raise RunBusy(describe(self.run_root.name, live[0], len(live) - 1) if live else
                                      f"run {self.run_root.name!r} is already running in another process "
                                      f"(its locks are in {self.folder})") from None
                    time.sleep(0.05 * (attempt + 1))
            os.write(me, json_bytes(self.holder))
            self._live_holders()  # and clear away the files of holders that died
            location = ledger_location(self.run_root)
            if isinstance(location, str):
                self._lease = Lease(location, self.holder).acquire()
        except BaseException:
            self._drop()
            raise
        self.count = 1
        return self

    def _live_holders(self) -> list[dict[str, Any]]:
        """Holders of overlapping scopes that are alive (their holder file is locked), earliest first;
        files of dead holders are removed."""
        live = []
        for path in self.folder.glob("*.holder"):
            if path == self._holder_file:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # released meanwhile
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # alive: it holds its file
                    try:
                        holder = json_loads(os.read(fd, 1 << 16))
                    except ValueError:
                        continue  # still taking its locks (or refused): says who it is once it holds them
                    if _overlaps(holder.get("batches"), self.holder["batches"]):
                        live.append(holder)
                else:
                    path.unlink(missing_ok=True)  # its process is gone
            finally:
                os.close(fd)
        return sorted(live, key=lambda holder: holder["since"])

    def _drop(self) -> None:
        """Give up everything held: the lease, the holder file, the flocks."""
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        self._holder_file.unlink(missing_ok=True)  # before its lock goes
        for fd in self._fds:
            os.close(fd)  # the kernel drops the flock with the last descriptor
        self._fds.clear()

    def release(self) -> None:
        """Release one hold; the last one of this process gives the run up."""
        with _registry_lock:
            self.count -= 1
            if self.count:
                return
            if _whole.get(self.run_root.resolve()) is self:
                del _whole[self.run_root.resolve()]
            self._drop()  # before another thread of this process may take the run again


_whole: dict[Path, Hold] = {}  # run folder -> this process's hold of the whole run
_registry_lock = threading.Lock()
_claimed: list[Hold] = []


def hold_run(run_root: Path, batches: Iterable[str] | None = None) -> Hold:
    """Hold the run `run_root` (or only `batches` of it) for this process; raise RunBusy if another
    process holds it (or one of those batches). Inside this process's hold of the whole run, this only
    counts: the CLI's Dagster steps run in its process. Give it back with `release()`."""
    with _registry_lock:
        whole = _whole.get(run_root.resolve())
        if whole is not None:
            whole.count += 1
            return whole
        hold = Hold(run_root, None if batches is None else sorted(set(batches))).acquire()
        if batches is None:
            _whole[run_root.resolve()] = hold
        return hold


@contextmanager
def holding(run_root: Path, batches: Iterable[str] | None = None) -> Iterator[Hold]:
    """`hold_run` for the length of a block."""
    hold = hold_run(run_root, batches)
    try:
        yield hold
    finally:
        hold.release()


def claim_run(run_root: Path) -> None:
    """Hold the whole run until `release_claims()` (or this process ends): a command that runs it."""
    _claimed.append(hold_run(run_root))


def release_claims() -> None:
    """Give back what `claim_run` took."""
    while _claimed:
        _claimed.pop().release()
