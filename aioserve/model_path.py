"""Where a model comes from: a local directory holding ``config.json``, or a hub id."""

from __future__ import annotations

import re
from pathlib import Path

#: A Hugging Face Hub repository id: ``name`` or ``owner/name``.
_HUB_ID = re.compile(r"^[\w.-]{1,96}(/[\w.-]{1,96})?$")


def check_model_path(spec: str) -> None:
    """Refuse ``spec`` when it names a local model that is not there, before anything loads.

    A directory must hold ``config.json``. Anything else is a hub id only when it has
    that form (``name`` or ``owner/name``, not starting with ``.``, ``/`` or ``~``) and
    its ``owner`` is not a local directory; otherwise it is a missing directory.

    Raises:
        FileNotFoundError: a directory without ``config.json``, or a directory that does
            not exist (the message names it and what is missing).
        NotADirectoryError: ``spec`` is a file.
    """
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
