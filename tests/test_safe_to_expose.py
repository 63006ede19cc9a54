"""Issue 52: safe to expose. The key protects every route that reveals requests or tenants
(``/metrics`` open only on purpose, then pseudonymous and bounded), the dashboard takes
the key once in a form (a cookie, never a URL), the served name is never a path, the
admission limit answers 429 with Retry-After (and a named websocket error) and ends a
request that waited too long, and TLS serves HTTPS and WSS."""

from __future__ import annotations

import asyncio
import datetime
import re
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cli_support import refuse as refuse_cli
from scripted_runner import GatedRunner, ScriptedRunner
from server_support import base_url, idle, metric, serve, wait_until

from aioserve import AsyncEngine, EngineConfig, QueueFullError, RequestMeta, SamplingParams
from aioserve.server import METRICS_KEY, ServerConfig, create_app
from aioserve.server.security_flags import api_key_of, tls_context
from aioserve.server.session import COOKIE

KEY = "sk-issue-52"
BEARER = {"Authorization": f"Bearer {KEY}"}
P = "aioserve:"


def engine_of(tokenizer, runner=None, **config) -> AsyncEngine:
    runner = runner or ScriptedRunner([300, 301, 302])
    return AsyncEngine(EngineConfig(model="scripted", **config), runner=runner,
                       tokenizer=tokenizer)


async def test_metrics_public_shows_no_raw_tenant_and_at_most_21_tenant_labels(tokenizer):
    engine = engine_of(tokenizer)
    config = ServerConfig(api_key=KEY, metrics_public=True)
    tenants = [f"user{i}@example.com" for i in range(25)]
    async with serve(engine, config) as server, aiohttp.ClientSession() as http:
        labels = server.app[METRICS_KEY].tenant_labels
        assert labels.pseudonymous  # the one rule, reachable for the policy reports
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
        for tenant in tenants:
            async for _ in engine.generate("Once", params, meta=RequestMeta(tenant=tenant)):
                pass
        async with http.get(base_url(server) + "/metrics") as r:  # no key: open on purpose
            assert r.status == 200
            text = await r.text()
        async with http.get(base_url(server) + "/ws/stats") as r:  # the rest is not
            assert r.status == 401
    assert "example.com" not in text and "user0" not in text
    values = set(re.findall(r'tenant_requests_total\{[^}]*tenant="([^"]+)"', text))
    assert len(values) == 21 and "other" in values
    assert all(re.fullmatch(r"t-[0-9a-f]{12}", v) for v in values - {"other"})
    assert labels(tenants[0]) in values  # the same label wherever it is used


async def test_a_server_without_a_key_keeps_tenants_pseudonymous_in_metrics(tokenizer):
    engine = engine_of(tokenizer)
    async with serve(engine) as server:
        assert server.app[METRICS_KEY].tenant_labels.pseudonymous
    async with serve(engine_of(tokenizer), ServerConfig(api_key=KEY)) as server:
        assert not server.app[METRICS_KEY].tenant_labels.pseudonymous


async def test_the_dashboard_logs_in_with_a_cookie_never_a_url(tokenizer):
    engine = engine_of(tokenizer)
    async with serve(engine, ServerConfig(api_key=KEY)) as server:
        url = base_url(server)
        jar = aiohttp.CookieJar(unsafe=True)  # a browser's, on an IP address
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.get(url + "/") as r:
                page = await r.text()
            assert r.status == 200 and "api_key=" not in page
            assert "location.search" not in page and 'id="login"' in page
            async with http.get(url + "/dashboard/session") as r:
                assert r.status == 401
            async with http.post(url + "/dashboard/login", json={"api_key": "wrong"}) as r:
                assert r.status == 401 and COOKIE not in r.cookies
            async with http.post(url + "/dashboard/login", json={}) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "api_key"
            async with http.post(url + "/dashboard/login", json={"api_key": KEY}) as r:
                assert r.status == 204
                cookie = r.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and KEY not in cookie
            async with http.get(url + "/dashboard/session") as r:
                assert r.status == 200
            async with http.ws_connect(url + "/ws/stats") as ws:
                frame = await ws.receive_json(timeout=30)
            assert frame["type"] == "frame" and frame["refused"] == {
                "queue_full": 0, "queue_timeout": 0}
            async with http.get(url + "/metrics") as r:
                assert r.status == 200
            async with http.get(url + "/v1/models") as r:  # the cookie opens no API route
                assert r.status == 401
            async with http.get(url + "/dashboard/session",
                                headers={"Origin": "http://evil.example"}) as r:
                assert r.status == 401  # another site's page cannot use it
            async with http.post(url + "/dashboard/logout") as r:
                assert r.status == 204
            async with http.get(url + "/dashboard/session") as r:
                assert r.status == 401


async def test_a_full_queue_answers_429_with_retry_after_and_a_late_request_ends(tokenizer):
    runner = GatedRunner([300, 301, 302])
    engine = engine_of(tokenizer, runner, max_num_seqs=1, max_waiting=1, max_queue_time_s=5)
    body = {"model": "scripted", "prompt": "Once", "max_tokens": 3, "ignore_eos": True}
    async with serve(engine) as server, aiohttp.ClientSession() as http:
        url = base_url(server)

        async def complete() -> tuple[int, dict, dict]:
            async with http.post(url + "/v1/completions", json=body) as r:
                return r.status, dict(r.headers), await r.json()

        first = asyncio.create_task(complete())
        await wait_until(lambda: engine.stats()["num_running"] == 1)
        second = asyncio.create_task(complete())
        await wait_until(lambda: engine.stats()["num_waiting"] == 1)
        status, headers, answer = await complete()
        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert answer["error"]["code"] == "queue_full"
        assert "max_waiting" in answer["error"]["message"]
        async with http.ws_connect(url + "/ws") as ws:
            await ws.send_json({"type": "generate", "id": "w", "prompt": "Once",
                                "max_tokens": 2})
            error = await ws.receive_json(timeout=30)
        assert error["type"] == "error" and error["code"] == "queue_full"
        runner.now = 6.0  # the waiting one has waited past max_queue_time_s
        runner.gate.set()
        status, headers, answer = await second
        assert status == 429 and answer["error"]["code"] == "queue_timeout"
        assert int(headers["Retry-After"]) >= 1
        status, _, answer = await first
        assert status == 200 and answer["usage"]["completion_tokens"] == 3
        await wait_until(lambda: idle(engine))
        async with http.get(url + "/metrics") as r:
            text = await r.text()
    assert metric(text, P + "num_requests_refused_total", 'reason="queue_full"') == 2
    assert metric(text, P + "num_requests_refused_total", 'reason="queue_timeout"') == 1


async def test_the_limit_is_the_engine_core_s(tokenizer):
    """The engine refuses alone, without the server (the simulator runs this core)."""
    runner = GatedRunner([300])
    async with engine_of(tokenizer, runner, max_num_seqs=1, max_waiting=1) as engine:
        params = SamplingParams(max_tokens=1)
        engine.add_request("Once", params)
        await wait_until(lambda: engine.stats()["num_running"] == 1)
        engine.add_request("Once", params)
        with pytest.raises(QueueFullError) as info:
            engine.add_request("Once", params)
        assert info.value.retry_after_s >= 1 and engine.core.admission.refused[
            "queue_full"] == 1
        runner.gate.set()
        await wait_until(lambda: idle(engine))


@pytest.mark.parametrize(("field", "value"), [("max_waiting", 0), ("max_queue_time_s", 0),
                                              ("max_queue_time_s", float("nan"))])
def test_bad_limits_are_named(field, value):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}"):
        EngineConfig(model="m", **{field: value})


def self_signed(directory: Path, days: int = 1) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and its key (``cryptography``, else the
    ``openssl`` command); ``days`` < 0: one that expired."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if days < 0:
            pytest.skip("an expired certificate needs the cryptography package")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", str(days), "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)], check=True,
                       capture_output=True, timeout=60)
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=abs(days) + 1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(private, hashes.SHA256()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key


async def test_https_completion_and_wss_websocket(tokenizer, tmp_path):
    cert, key = self_signed(tmp_path)
    server_tls = tls_context(str(cert), str(key))
    app = create_app(engine_of(tokenizer), ServerConfig(api_key=KEY))
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    try:
        port = runner.addresses[0][1]
        client_tls = ssl.create_default_context(cafile=str(cert))
        body = {"model": "scripted", "prompt": "Once", "max_tokens": 3, "ignore_eos": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"https://127.0.0.1:{port}/v1/completions", json=body,
                                 headers=BEARER, ssl=client_tls) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 3
            async with http.ws_connect(f"wss://127.0.0.1:{port}/ws", headers=BEARER,
                                       ssl=client_tls) as ws:
                await ws.send_json({"type": "generate", "id": "a", "prompt": "Once",
                                    "max_tokens": 2, "ignore_eos": True})
                kinds = []
                while not kinds or kinds[-1] not in ("done", "error"):
                    kinds.append((await ws.receive_json(timeout=30))["type"])
            assert kinds == ["token", "token", "done"]
            with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served
                async with http.get(f"http://127.0.0.1:{port}/health"):
                    pass
    finally:
        await runner.cleanup()


def test_key_sources(tmp_path):
    file = tmp_path / "key"
    file.write_text(KEY + "\n")
    file.chmod(0o600)
    assert api_key_of(None, str(file), {}) == KEY
    assert api_key_of(None, None, {"AIOSERVE_API_KEY": "env"}) == "env"
    assert api_key_of("flag", None, {"AIOSERVE_API_KEY": "env"}) == "flag"
    assert api_key_of(None, None, {}) is None


def refuse(*args: str) -> str:
    """The one error line of a refused ``serve`` that never imported torch."""
    return refuse_cli("serve", "--port", "0", *args)


def test_unusable_key_files_and_certificates_are_refused_before_the_model_loads(
        model_dir, tmp_path):
    cert, key = self_signed(tmp_path)
    (tmp_path / "other").mkdir()
    _, other_key = self_signed(tmp_path / "other")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    (tmp_path / "old").mkdir()
    expired, expired_key = self_signed(tmp_path / "old", days=-1)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        (["--api-key-file", str(tmp_path / "missing")], "--api-key-file", "cannot read"),
        (["--api-key-file", str(empty)], "--api-key-file", "holds no key"),
        (["--api-key-file", str(empty), "--api-key", "k"], "--api-key-file", "once"),
        (["--ssl-certfile", str(tmp_path / "missing.pem")], "--ssl-certfile", "cannot read"),
        (["--ssl-certfile", str(garbage), "--ssl-keyfile", str(key)], "--ssl-", "cannot"),
        (["--ssl-certfile", str(cert), "--ssl-keyfile", str(other_key)], "--ssl-keyfile",
         "cannot use"),
        (["--ssl-keyfile", str(key)], "--ssl-keyfile", "needs --ssl-certfile"),
        (["--ssl-certfile", str(expired), "--ssl-keyfile", str(expired_key)],
         "--ssl-certfile", "expired on"),
        (["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ssl-ca-certs",
          str(garbage)], "--ssl-ca-certs", "cannot use"),
        (["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ray"], "--ssl-certfile",
         "not with --ray"),
        (["--max-waiting", "0"], "--max-waiting", "positive"),
        (["--max-queue-time-s", "-1"], "--max-queue-time-s", ""),
    ]
    for options, flag, reason in cases:
        line = refuse("--model", model_dir, *options)
        assert line.startswith(f"aioserve: error: {flag}") or flag in line, line
        assert reason in line, line


def test_the_one_preflight_pass_checks_the_key_file_and_the_certificate(tmp_path, capsys,
                                                                        monkeypatch):
    """serve's SERVE checks refuse an unusable key file or certificate naming the flag, and
    warn once about a key file others may read (building the settings later says nothing)."""
    from aioserve.cli import build_parser
    from aioserve.commands.preflight import SERVE, preflight
    from aioserve.commands.serve import server_config

    monkeypatch.delenv("AIOSERVE_API_KEY", raising=False)
    cert, key = self_signed(tmp_path)
    empty = tmp_path / "empty"
    empty.write_text("\n")

    def serve_args(*options: str):
        return build_parser().parse_args(["serve", "--model", "m", *options])

    with pytest.raises(ValueError, match=r"^--api-key-file: .* holds no key"):
        preflight(serve_args("--api-key-file", str(empty)), SERVE)
    with pytest.raises(ValueError, match=r"^--ssl-keyfile: needs --ssl-certfile"):
        preflight(serve_args("--ssl-keyfile", str(key)), SERVE)
    (tmp_path / "other").mkdir()
    _, other_key = self_signed(tmp_path / "other")
    with pytest.raises(ValueError, match=r"^--ssl-keyfile: cannot use"):
        preflight(serve_args("--ssl-certfile", str(cert), "--ssl-keyfile", str(other_key)),
                  SERVE)
    shared = tmp_path / "shared-key"
    shared.write_text(KEY + "\n")
    shared.chmod(0o644)
    args = serve_args("--api-key-file", str(shared), "--ssl-certfile", str(cert),
                      "--ssl-keyfile", str(key))
    capsys.readouterr()
    preflight(args, SERVE)
    assert server_config(args).api_key == KEY
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and "readable by other users" in warnings[0], warnings
    assert "mode 644" in warnings[0], warnings


def test_serve_takes_the_key_file_over_the_environment(tmp_path, monkeypatch):
    from aioserve.cli import build_parser
    from aioserve.commands.common import engine_config
    from aioserve.commands.serve import admission_config, server_config

    file = tmp_path / "key"
    file.write_text(KEY)
    file.chmod(0o600)
    monkeypatch.setenv("AIOSERVE_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--model", "m", "--api-key-file", str(file),
                                      "--metrics-public", "--max-queued-requests", "4",
                                      "--max-queue-time-s", "2.5"])
    settings = server_config(args)
    assert settings.api_key == KEY and settings.metrics_public and settings.metrics_open
    config = admission_config(engine_config(args), args)
    assert (config.max_waiting, config.max_queue_time_s) == (4, 2.5)
    args = build_parser().parse_args(["serve", "--model", "m"])
    assert server_config(args).api_key == "from-env"
