"""The one pre-load validation pass: every check that needs only the arguments, a model's
``config.json``, a template or a path, run before torch loads (well under a second), each
refusal a ValueError that names its flag.

A command runs :func:`preflight` with its list of checks (:data:`GENERATE`, :data:`SERVE`);
a new flag whose value can be judged without the model adds its check function here and to
those lists (room is left for a dtype check), rather than checking it after the model has
loaded. ``serve``'s key file and TLS files are checked here (:func:`check_api_key`,
:func:`check_tls`); serve reads them again, from checked inputs, to build its settings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aioserve.commands.common import check_output
from aioserve.model_path import check_model_path

#: One check: reads the parsed options, raises ValueError naming the flag at fault.
Check = Callable[[argparse.Namespace], None]


def preflight(args: argparse.Namespace, checks: Sequence[Check]) -> None:
    """Run ``checks`` in order; the first refusal ends the command (``aioserve: error: ...``)."""
    for check in checks:
        check(args)


def model_config(spec: str) -> dict[str, Any] | None:
    """The text model's part of a local model directory's ``config.json`` (a multimodal
    config's ``text_config``), or None for a hub id or an unreadable file (the loader says
    why later)."""
    path = Path(spec).expanduser() / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _max_positions(model: str) -> int | None:
    """The model's ``max_position_embeddings`` from its ``config.json``, else None."""
    config = model_config(model)
    length = None if config is None else config.get("max_position_embeddings")
    valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
    return length if valid else None


def model_context(args: argparse.Namespace) -> tuple[int, str] | None:
    """(context length in tokens, where it comes from) as the runner will use it, when
    ``config.json`` alone decides it; None otherwise."""
    if getattr(args, "max_model_len", None) is not None:
        return args.max_model_len, "--max-model-len"
    length = _max_positions(args.model)
    return None if length is None else (length, "the model's max_position_embeddings")


def check_max_model_len(args: argparse.Namespace) -> None:
    """``--max-model-len`` beyond the model's ``max_position_embeddings``."""
    length = None if args.max_model_len is None else _max_positions(args.model)
    if length is not None and args.max_model_len > length:
        raise ValueError(f"--max-model-len {args.max_model_len}: beyond the model's context "
                         f"of {length} tokens (max_position_embeddings in its config.json)")


def check_tokenizer(args: argparse.Namespace) -> None:
    """``--tokenizer`` naming a local path that does not exist (a hub id passes)."""
    spec = args.tokenizer
    if spec is None:
        return
    path = Path(spec).expanduser()
    if path.is_dir():
        return
    try:
        check_model_path(spec)
    except OSError:
        raise ValueError(f"--tokenizer: {spec!r} does not exist (give a tokenizer directory, "
                         "a hub id, or leave it out to use the model's)") from None
    if path.exists():
        raise ValueError(f"--tokenizer: {spec!r} is a file; give the tokenizer's directory")


def check_chat_template(args: argparse.Namespace) -> None:
    """``--chat-template`` unreadable, or not a Jinja template (compiled as transformers
    compiles chat templates, in a sandbox)."""
    if args.chat_template is None:
        return
    try:
        text = Path(args.chat_template).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--chat-template: cannot read {args.chat_template}: {exc}") from None
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    except TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template {args.chat_template}: not a valid Jinja template: "
                         f"line {exc.lineno}: {exc.message}") from None


def ray_only_defaults() -> dict[str, Any]:
    """The options ``serve`` reads only with ``--ray`` (``serve_ray.add_ray_options``'s, the
    one place they are declared), and their defaults."""
    from aioserve.commands.serve_ray import add_ray_options

    parser = argparse.ArgumentParser(add_help=False)
    add_ray_options(parser)
    return {action.dest: action.default for action in parser._actions if action.dest != "ray"}


def check_ray_only(args: argparse.Namespace) -> None:
    """Options of ``serve --ray`` given without ``--ray`` (they would be ignored)."""
    if args.ray:
        return
    given = [name for name, default in ray_only_defaults().items()
             if getattr(args, name) != default]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags}: only with --ray (one process serves one engine; add "
                         "--ray to serve replicas on Ray Serve)")


def check_prompt(args: argparse.Namespace) -> None:
    """``generate``'s PROMPT empty."""
    if not args.prompt:
        raise ValueError("PROMPT is empty: give the text to continue")


def check_max_tokens(args: argparse.Namespace) -> None:
    """``generate --max-tokens`` that cannot fit the context with a prompt of one token."""
    context = model_context(args)
    if context is not None and args.max_tokens >= context[0]:
        raise ValueError(f"--max-tokens {args.max_tokens}: the prompt and the output must fit "
                         f"the context of {context[0]} tokens ({context[1]}); give at most "
                         f"{context[0] - 1}")


def check_step_log(args: argparse.Namespace) -> None:
    """``serve --step-log``: not with ``--ray``; its file writable."""
    if args.step_log is None:
        return
    if args.ray:
        raise ValueError("--step-log: not with --ray (its replicas are separate engines; "
                         "log one with aioserve serve)")
    check_output(args.step_log, "--step-log")


def check_base_url(args: argparse.Namespace) -> None:
    """``bench serve --base-url`` that is not an http(s) URL with a host."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(args.base_url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  a port out of range raises
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"--base-url {args.base_url!r}: not an http(s) URL with a host; "
                         "e.g. http://127.0.0.1:8000")


def check_api_key(args: argparse.Namespace) -> None:
    """``serve``'s key: ``--api-key`` and ``--api-key-file`` both given, a key file that
    cannot be read or holds no key, or a blank key (flag or ``$AIOSERVE_API_KEY``); warns
    (stderr) when the key file is readable by other users."""
    from aioserve.server.security_flags import API_KEY_ENV, api_key_of, key_file_warning

    explicit = args.api_key if args.api_key != os.environ.get(API_KEY_ENV) else None
    api_key_of(explicit, args.api_key_file)
    warning = None if args.api_key_file is None else key_file_warning(args.api_key_file)
    if warning is not None:
        print(warning, file=sys.stderr)


def check_tls(args: argparse.Namespace) -> None:
    """``serve``'s TLS files: a key or CA without a certificate, a file that cannot be read,
    a certificate that is not PEM, expired or not yet valid, a key that does not match it,
    a CA bundle that cannot be loaded (the context is built once here and discarded); and
    TLS with ``--ray``, whose proxy serves plain HTTP."""
    from aioserve.server.security_flags import tls_context

    tls_context(args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs)
    if args.ray and args.ssl_certfile is not None:
        raise ValueError("--ssl-certfile: not with --ray (Ray Serve's proxy serves HTTP; "
                         "terminate TLS in front of it)")


#: The checks of the commands that load a model (after the options' own types).
ENGINE: list[Check] = [check_max_model_len, check_tokenizer]
#: ``aioserve generate``.
GENERATE: list[Check] = [check_prompt, *ENGINE, check_max_tokens]
#: ``aioserve serve``.
SERVE: list[Check] = [*ENGINE, check_ray_only, check_chat_template, check_step_log,
                      check_api_key, check_tls]
#: ``aioserve bench serve`` (against a running server).
BENCH_SERVE: list[Check] = [check_base_url]
