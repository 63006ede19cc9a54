"""What the server's handlers share: its settings and the engine, as typed app keys."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from aioserve.engine import AsyncEngine


@dataclass(frozen=True)
class ServerConfig:
    """Settings of the HTTP and websocket server.

    Attributes:
        served_model_name: the model name clients send and ``/v1/models`` lists;
            None: a local directory's own name, a hub id as it is (see
            :func:`model_names`; never a filesystem path, which would be public).
        chat_template: a Jinja chat template (the text, not a path) that overrides the
            tokenizer's own; with neither, chat requests get a 400.
        max_body_bytes: largest request body or websocket message in bytes (larger: 413,
            or a websocket close with 1009).
        ws_max_pending: most messages queued for one websocket before its generation
            pauses.
        ws_stall_timeout: seconds a websocket may stay paused (its client not reading)
            before its requests are aborted and the socket closed with 1008.
        ws_send_buffer_bytes: bytes the transport of one websocket buffers before
            sending waits for the client.
        stats_interval: least seconds between two dashboard frames on ``/ws/stats``
            (0.1: at most 10 a second; 0: every engine step).
        api_key: when set, ``/v1/*``, the websockets and ``/metrics`` need
            ``Authorization: Bearer <api_key>`` (the dashboard: its session cookie; see
            :mod:`aioserve.server.access`).
        metrics_public: ``/metrics`` answers without the key (for a scraper that cannot
            send one); its tenant labels are then pseudonymous (see :attr:`metrics_open`).
        allowed_origins: origins browsers may call the API from (CORS); ``"*"``: any;
            empty: no CORS headers.
        step_log: a file the engine's steps are written to while it serves, as JSON
            lines (:mod:`aioserve.engine.step_log`; ``aioserve calibrate
            --from-steps`` fits a profile on them); None: no log.
    """

    served_model_name: str | None = None
    chat_template: str | None = None
    max_body_bytes: int = 1024**2
    ws_max_pending: int = 256
    ws_stall_timeout: float = 5.0
    ws_send_buffer_bytes: int = 64 * 1024
    stats_interval: float = 0.1
    api_key: str | None = None
    metrics_public: bool = False
    allowed_origins: tuple[str, ...] = ()
    step_log: str | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.ws_max_pending < 1:
            raise ValueError(f"ws_max_pending must be >= 1, got {self.ws_max_pending}")
        if not self.ws_stall_timeout > 0:
            raise ValueError(f"ws_stall_timeout must be > 0, got {self.ws_stall_timeout}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty or blank")
        if not self.stats_interval >= 0:
            raise ValueError(f"stats_interval must be >= 0 seconds, got {self.stats_interval}")
        if self.ws_send_buffer_bytes < 1024:
            raise ValueError(
                f"ws_send_buffer_bytes must be >= 1024, got {self.ws_send_buffer_bytes}"
            )


    @property
    def metrics_open(self) -> bool:
        """Whether anyone may read ``/metrics`` (no key, or ``metrics_public``): then every
        tenant label in it is a keyed hash (:class:`~aioserve.server.tenant_labels.
        TenantLabels` ``pseudonymous``), never a raw ``user`` value."""
        return self.api_key is None or self.metrics_public


ENGINE_KEY: web.AppKey[AsyncEngine] = web.AppKey("engine", AsyncEngine)
CONFIG_KEY: web.AppKey[ServerConfig] = web.AppKey("server_config", ServerConfig)


def model_path(model: str) -> str:
    """A local directory's absolute path (symbolic links kept), a hub id as it is."""
    path = os.path.expanduser(model)
    return os.path.abspath(path) if os.path.isdir(path) else model


def default_model_name(model: str) -> str:
    """The name a model is served under by default: a local directory's own name (its
    path stays private), a hub id as it is."""
    path = model_path(model)
    return Path(path).name if os.path.isdir(path) else model


def served_model_name(app: web.Application) -> str:
    """The name the server answers to."""
    return app[MODEL_NAMES_KEY][0]


def model_names(config: ServerConfig, engine: AsyncEngine) -> tuple[str, ...]:
    """The served name, then (without ``--served-model-name``) the other names a request
    may use: the ``--model`` path as given and the directory's absolute path (accepted,
    never shown)."""
    if config.served_model_name:
        return (config.served_model_name,)
    model = engine.config.model
    return tuple(dict.fromkeys((default_model_name(model), model, model_path(model))))


#: :func:`model_names`, worked out once when the app is made.
MODEL_NAMES_KEY: web.AppKey[tuple[str, ...]] = web.AppKey("model_names", tuple)
