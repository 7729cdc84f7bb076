"""deploy/nginx.conf terminates TLS in front of a real node: the file as shipped (only
paths, ports and the certificate swapped for temporary ones) passes ``nginx -t`` and then
serves the node over HTTPS — tokens, JSON errors and live-query streams included —, writes
no token of a URL into its logs, and passes a backup over its body cap to /v1/import."""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import shutil
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from .conftest import Cli

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    crt, pem = tmp / "fullchain.pem", tmp / "privkey.pem"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return crt, pem


def _swap(text: str, old: str, new: str) -> str:
    assert old in text, f"deploy/nginx.conf no longer contains {old!r}"
    return text.replace(old, new)


@pytest.fixture
def nginx_bin() -> str:
    if not Path(NGINX).exists():
        pytest.fail("nginx missing: run tests/setup.d/50-nginx.sh")
    return NGINX


def test_nginx_conf_terminates_tls_for_a_node(tmp_path: Path, node_factory, nginx_bin) -> None:
    home = tmp_path / "home"
    Cli(home)("init")
    node = node_factory(home).start()
    crt, pem = _self_signed(tmp_path)
    https_port, http_port = _free_port(), _free_port()
    text = CONF.read_text()
    for old, new in (
        ("/var/log/nginx/merklog-error.log", str(tmp_path / "error.log")),
        ("/var/log/nginx/merklog-access.log", str(tmp_path / "access.log")),
        # The body cap, small enough to exceed here: /v1/import must not have it.
        ("client_max_body_size 300m;", "client_max_body_size 1k;"),
        ("/etc/letsencrypt/live/node.example.org/fullchain.pem", str(crt)),
        ("/etc/letsencrypt/live/node.example.org/privkey.pem", str(pem)),
        ("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;"),
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("server 127.0.0.1:7420;", f"server {node.url.removeprefix('http://')};"),
    ):
        text = _swap(text, old, new)
    # No pid line: the distribution's nginx.service names the pid file nginx is built
    # with (Debian: /run/nginx.pid), and `systemctl reload nginx` waits on that one.
    assert not re.search(r"^\s*pid\s", text, re.M), "deploy/nginx.conf sets its own pid file"
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    pid = f"pid {tmp_path / 'nginx.pid'};"
    base = [nginx_bin, "-p", str(tmp_path), "-c", str(conf)]
    check = subprocess.run([*base, "-g", pid, "-t"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([*base, "-g", f"{pid} daemon off;"], stderr=subprocess.PIPE, text=True)
    try:
        ctx = ssl.create_default_context(cafile=str(crt))
        url = f"https://127.0.0.1:{https_port}"

        def call(path: str, token: str | None = None, body: dict | None = None):
            data = json.dumps(body).encode() if body is not None else None
            req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET")
            req.add_header("Content-Type", "application/json")
            if token:
                req.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        deadline = time.monotonic() + 30
        while True:
            try:
                assert call("/healthz")[0] == 200
                break
            except (OSError, ssl.SSLError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        status, err = call("/v1/status")
        assert status == 401 and err["error"] == "unauthorized"
        status, written = call("/v1/facts", node.token, {"assert": "edge(1, 2)."})
        assert status == 200 and written["asserted"][0]["fact"] == "edge(1, 2)"
        status, err = call("/v1/nope", node.token)
        assert status == 404 and "error" in err
        req = urllib.request.Request(
            url + "/v1/subscribe?q=edge(1,%20X)",
            headers={"Authorization": f"Bearer {node.read_token}"},
        )
        with urllib.request.urlopen(req, timeout=30, context=ctx) as stream:
            assert stream.readline() == b"event: result\n"
            assert json.loads(stream.readline()[6:])["added"] == [[2]]
        # Plain HTTP is redirected to HTTPS.
        conn = socket.create_connection(("127.0.0.1", http_port), timeout=10)
        conn.sendall(b"GET /v1/status HTTP/1.1\r\nHost: node.example.org\r\n\r\n")
        head = conn.recv(4096).decode()
        conn.close()
        assert head.startswith("HTTP/1.1 308") and "https://node.example.org/v1/status" in head

        # A backup over the body cap passes to /v1/import (the node spools it); other
        # routes keep the cap.
        many = " ".join(f"n({i})." for i in range(200))
        req = urllib.request.Request(
            url + "/v1/facts",
            data=json.dumps({"assert": many}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {node.token}", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as capped:
            urllib.request.urlopen(req, timeout=30, context=ctx)
        assert capped.value.code == 413  # nginx's own answer: the cap applies here
        assert node.request("POST", "/v1/facts", {"assert": many})[0] == 200
        req = urllib.request.Request(
            url + "/v1/export", headers={"Authorization": f"Bearer {node.token}"}
        )
        with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
            car = resp.read()
        assert len(car) > 4096
        req = urllib.request.Request(
            url + "/v1/import",
            data=car,
            method="POST",
            headers={
                "Authorization": f"Bearer {node.token}",
                "Content-Type": "application/vnd.ipld.car",
            },
        )
        with urllib.request.urlopen(req, timeout=60, context=ctx) as resp:
            assert resp.status == 200

        # Tokens in URLs (?access_token=, for EventSource) are written to no log: not in
        # the access log's request lines, nor in the error log when the node is down.
        read = node.read_token
        status, facts = call(f"/v1/facts?rel=edge&access_token={urllib.parse.quote(read)}")
        assert status == 200 and facts["facts"][0]["fact"] == "edge(1, 2)"
        node.stop()
        with pytest.raises(urllib.error.HTTPError) as down:
            urllib.request.urlopen(
                f"{url}/v1/status?access_token={urllib.parse.quote(read)}", timeout=30, context=ctx
            )
        assert down.value.code == 502
        # nginx logs a request once it has answered it: the line may come a moment later.
        deadline = time.monotonic() + 10
        access = (tmp_path / "access.log").read_text()
        while '" 502 ' not in access and time.monotonic() < deadline:
            time.sleep(0.05)
            access = (tmp_path / "access.log").read_text()
        assert '"GET /v1/facts HTTP/1.1" 200' in access, access
        assert '"GET /v1/status HTTP/1.1" 502' in access, access
        for log in tmp_path.glob("*.log"):
            text = log.read_text()
            assert read not in text and urllib.parse.quote(read) not in text, (log, text)
            assert node.token not in text, log
            assert "access_token" not in text, (log, text)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
