"""A run directory as bytes and back: how a shard's results travel from a node to the driver
without a shared filesystem (run.ray_fleet)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path


def pack(directory: Path) -> bytes:
    """A run directory as an uncompressed tar (its tables compress little; time matters more)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(directory, arcname=".")
    return buffer.getvalue()


def unpack(archive: bytes, directory: Path) -> None:
    """A shard's tar into `directory`, replacing what an earlier attempt left there; the "data"
    filter refuses links and paths that leave it."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as opened:
        opened.extractall(directory, filter="data")
