"""The dashboard page: one self-contained HTML file, live over ``/ws/stats`` or replaying frames."""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _page(title: str, boot: str) -> str:
    page = _asset("dashboard.html")
    for key, value in (("{{TITLE}}", html.escape(title)), ("{{CSS}}", _asset("dashboard.css")),
                       ("{{JS}}", _asset("dashboard.js")), ("{{BOOT}}", boot)):
        page = page.replace(key, value)
    return page


def live_page(title: str = "aioserve dashboard") -> str:
    """The page ``GET /`` serves: it subscribes to ``/ws/stats`` on its own host."""
    return _page(title, "AIOSERVE.live();")


def replay_page(runs: dict[str, list[dict[str, Any]]],
                title: str = "aioserve simulation") -> str:
    """A self-contained page replaying ``runs`` (policy name -> frames) with a time slider."""
    data = json.dumps(runs, separators=(",", ":")).replace("</", "<\\/")
    return _page(title, f"AIOSERVE.replay({data});")
