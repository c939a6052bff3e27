"""Talking to the Docker engine: connecting with clear errors, and files through its archive API."""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import time
from contextlib import contextmanager
from typing import Iterator

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from hermes_core.sandbox.base import SandboxError, not_regular, too_large

API_TIMEOUT_S = 120  # per engine call; commands themselves are bounded by their own timeout
MAX_POOL_SIZE = 32  # concurrent sessions share one client
_GO_MODE_DIR, _GO_MODE_SYMLINK = 1 << 31, 1 << 27  # os.FileMode bits in the engine's path stat
_GO_SPECIAL_BITS = ((1 << 23, 0o4000), (1 << 22, 0o2000), (1 << 20, 0o1000))  # setuid, setgid, sticky
_GO_MODE_IRREGULAR = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)  # devices, FIFO, socket, ...
_TAR_OVERHEAD = 64 << 10  # an archive of one file: its headers and padding beyond the file's bytes
_MAX_LINKS = 16


def engine_location() -> str:
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else "DOCKER_HOST is unset, so unix:///var/run/docker.sock"


def engine_unreachable(exc: BaseException) -> SandboxError:
    reason = " ".join(str(exc).split())[:300]
    return SandboxError(f"no Docker engine reachable ({engine_location()}): {reason}. Start one "
                        "(e.g. `scripts/dockerd.sh start`) and export the DOCKER_HOST it prints.")


def connect() -> docker.DockerClient:
    """A client for the engine of DOCKER_HOST, checked with a ping.

    Two failure shapes are turned into one message: `from_env()` negotiating the API version raises
    DockerException when nothing answers, while a client with an explicit version is built fine and
    fails on its first call with a requests ConnectionError."""
    try:
        client = docker.from_env(timeout=API_TIMEOUT_S, max_pool_size=MAX_POOL_SIZE)
        client.ping()
    except (DockerException, requests.RequestException) as exc:
        raise engine_unreachable(exc) from None
    return client


@contextmanager
def engine_errors(what: str) -> Iterator[None]:
    """Engine failures as SandboxError (the tool reports them to the model), never a stack trace."""
    try:
        yield
    except requests.ConnectionError as exc:
        raise engine_unreachable(exc) from None
    except APIError as exc:
        raise SandboxError(f"{what}: {exc.explanation or exc}") from None
    except (DockerException, requests.RequestException) as exc:
        raise SandboxError(f"{what}: {exc}") from None


def tar_of(entries: list[tuple[str, bytes | None, int]], uid: int) -> bytes:
    """A tar of (relative path, content or None for a folder, mode) entries owned by `uid`: the engine
    extracts it as root and keeps the owner, so the sandbox user owns what tools create."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content, mode in entries:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = uid
            info.mode, info.mtime = mode, int(time.time())
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def put_archive(api: docker.APIClient, container_id: str, directory: str, data: bytes) -> tuple[int, str]:
    """Extract `data` into `directory`; returns (HTTP status, message). Unlike the SDK's put_archive
    it asks the engine never to replace a folder by a file (which would delete the folder)."""
    url = f"{api.base_url}/v{api.api_version}/containers/{container_id}/archive"
    response = api.put(url, params={"path": directory, "noOverwriteDirNonDir": "true"}, data=data,
                       timeout=API_TIMEOUT_S)
    try:
        message = response.json().get("message", response.text) if response.status_code != 200 else ""
    except ValueError:
        message = response.text
    return response.status_code, message


def path_stat(api: docker.APIClient, container_id: str, path: str) -> dict | None:
    """The engine's stat of `path` (HEAD request: no content transferred), None when missing."""
    url = f"{api.base_url}/v{api.api_version}/containers/{container_id}/archive"
    response = api.head(url, params={"path": path}, timeout=API_TIMEOUT_S)
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise SandboxError(f"cannot read {path!r}: HTTP {response.status_code}")
    return docker.utils.decode_json_header(response.headers["X-Docker-Container-Path-Stat"])


def unix_mode(api: docker.APIClient, container_id: str, path: str, default: int) -> int:
    """Permission bits (with setuid/setgid/sticky) of a folder, `default` when it does not exist."""
    stat = path_stat(api, container_id, path)
    if stat is None or not int(stat.get("mode", 0)) & _GO_MODE_DIR:
        return default
    mode = int(stat["mode"])
    return (mode & 0o777) | sum(bit for go_bit, bit in _GO_SPECIAL_BITS if mode & go_bit)


def read_archive_file(api: docker.APIClient, container_id: str, path: str, limit: int) -> bytes:
    """Bytes of a regular file (symlinks followed) of at most `limit` bytes through the engine's archive
    API, which archives a FIFO or device as such instead of opening it (refused here)."""
    for _ in range(_MAX_LINKS):
        stat = path_stat(api, container_id, path)
        if stat is None:
            raise FileNotFoundError(f"no such file in the sandbox: {path}")
        mode = int(stat.get("mode", 0))
        if mode & _GO_MODE_SYMLINK:  # the engine gives the link's fully resolved target
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), stat["linkTarget"]))
            continue
        if mode & _GO_MODE_DIR:
            raise SandboxError(f"{path!r} is a directory")
        if mode & _GO_MODE_IRREGULAR:
            raise not_regular(path)
        if int(stat.get("size", 0)) > limit:
            raise too_large(path, limit)
        try:
            stream, _ = api.get_archive(container_id, path)
        except NotFound:
            raise FileNotFoundError(f"no such file in the sandbox: {path}") from None
        archive = bytearray()
        for chunk in stream:  # the file may have grown since its stat
            archive += chunk
            if len(archive) > limit + _TAR_OVERHEAD:
                raise too_large(path, limit)
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            if handle is None:
                raise not_regular(path)
            if member.size > limit:
                raise too_large(path, limit)
            return handle.read()
    raise SandboxError(f"{path!r}: too many levels of symbolic links")
