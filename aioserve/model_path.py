"""Where a model comes from: a local directory holding ``config.json``, or a hub id."""

from __future__ import annotations

import re
from pathlib import Path

#: A Hugging Face Hub repository id: ``name`` or ``owner/name``.
_HUB_ID = re.compile(r"^[\w.-]{1,96}(/[\w.-]{1,96})?$")


def check_model_path(spec: str) -> None:
    """Refuse, before anything loads, a local model that is not there: a directory
    without ``config.json`` or one that does not exist (FileNotFoundError), or a file
    (NotADirectoryError). A hub id (``name`` or ``owner/name``, no local ``owner``) passes."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model directory {spec!r} has no config.json (a "
                                    "transformers model directory holds one)")
        return
    if path.exists():
        raise NotADirectoryError(f"{spec!r} is a file, not a model directory")
    if (spec.startswith((".", "/", "~")) or not _HUB_ID.match(spec)
            or ("/" in spec and path.parent.is_dir())):
        raise FileNotFoundError(f"model directory {spec!r} does not exist")
