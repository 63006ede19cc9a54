"""The security flags of ``aioserve serve`` checked before the model loads: the API key
(``--api-key``, ``--api-key-file``, ``$AIOSERVE_API_KEY``) and the TLS files
(``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-ca-certs``). Each check returns what the
server needs, or raises ValueError whose message starts with the flag at fault; none
imports torch, so a refusal comes in well under a second.
"""

from __future__ import annotations

import datetime
import os
import ssl
import stat

#: The environment variable the key may come from.
API_KEY_ENV = "AIOSERVE_API_KEY"


def read_api_key_file(path: str) -> str:
    """The key in ``path`` (its first line, surrounding blanks stripped).

    Raises:
        ValueError: ``--api-key-file: ...`` when the file cannot be read, is not UTF-8
            text, or holds no key.
    """
    try:
        with open(path, encoding="utf-8") as file:
            key = file.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ValueError(f"--api-key-file: cannot read {path}: {reason}") from None
    if not key:
        raise ValueError(f"--api-key-file: {path} holds no key (its first line is empty); "
                         "the server would be open to anyone")
    return key


def key_file_warning(path: str) -> str | None:
    """A warning when the key file ``path`` is a regular file other users may read or
    write (said once, by the start-up check); None otherwise or when it cannot be read."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and stat.S_ISREG(mode):
        return (f"warning: --api-key-file {path} is readable by other users "
                f"(mode {stat.S_IMODE(mode):o}); chmod 600 it")
    return None


def api_key_of(flag: str | None, file: str | None,
               environ: dict[str, str] | None = None) -> str | None:
    """The key from ``--api-key`` (``flag``), ``--api-key-file`` (``file``) or
    ``$AIOSERVE_API_KEY``, in that order; None when none is given.

    Raises:
        ValueError: naming the flag: both flags given, a blank key (an unset variable
            expanded to nothing would leave the server open), or a file that cannot be used.
    """
    env = os.environ if environ is None else environ
    if flag is not None and file is not None:
        raise ValueError("--api-key-file: give the key once, either --api-key or "
                         "--api-key-file")
    if file is not None:
        return read_api_key_file(file)
    key = flag if flag is not None else env.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"--api-key (or ${API_KEY_ENV}) is empty: an unset variable? The "
                         "server would be open to anyone; give a key, or leave both out to "
                         "serve without one")
    return key


def tls_context(certfile: str | None, keyfile: str | None,
                ca_certs: str | None = None) -> ssl.SSLContext | None:
    """A server SSL context (TLS 1.2 or newer) from PEM files, or None without
    ``certfile``. With ``ca_certs`` a client must present a certificate it signed.

    Raises:
        ValueError: naming the flag: a key or CA without a certificate, a file that
            cannot be read, a certificate that is not PEM, expired or not yet valid (checked
            when ``cryptography`` is installed), or a key that does not match.
    """
    if certfile is None:
        for flag, value in (("--ssl-keyfile", keyfile), ("--ssl-ca-certs", ca_certs)):
            if value is not None:
                raise ValueError(f"{flag}: needs --ssl-certfile (the server's certificate)")
        return None
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile),
                       ("--ssl-ca-certs", ca_certs)):
        if path is not None and not os.access(path, os.R_OK):
            why = "no such file" if not os.path.exists(path) else "not readable"
            raise ValueError(f"{flag}: cannot read {path}: {why}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        flag = "--ssl-keyfile" if "KEY" in str(exc).upper() else "--ssl-certfile"
        raise ValueError(f"{flag}: cannot use {keyfile or certfile} with {certfile}: "
                         f"{exc.reason or exc}") from None
    except OSError as exc:
        raise ValueError(f"--ssl-certfile: cannot load {certfile}: {exc}") from None
    _check_dates(certfile)
    if ca_certs is not None:
        try:
            context.load_verify_locations(cafile=ca_certs)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"--ssl-ca-certs: cannot use {ca_certs}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _check_dates(certfile: str) -> None:
    """ValueError naming ``--ssl-certfile`` when its first certificate is expired or not yet
    valid (clients would refuse it); skipped without the ``cryptography`` package."""
    try:
        from cryptography import x509
    except ImportError:
        return
    try:
        with open(certfile, "rb") as file:
            certificate = x509.load_pem_x509_certificate(file.read())
    except (OSError, ValueError):
        return  # ssl loaded it: a form this check does not read
    now = datetime.datetime.now(datetime.timezone.utc)
    if certificate.not_valid_after_utc < now:
        raise ValueError(f"--ssl-certfile: {certfile} expired on "
                         f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    if certificate.not_valid_before_utc > now:
        raise ValueError(f"--ssl-certfile: {certfile} is not valid before "
                         f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
