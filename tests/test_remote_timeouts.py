"""Remote calls time out against servers that go silent, with a message naming the host and what to check.

The servers are plain sockets on 127.0.0.1: one accepts connections and never answers (the hang reported in
issue 20); one speaks just enough of the NDIF wire protocol (the websocket handshake, the session id, the POST
of the request) and then goes silent at a chosen stage, so each timeout of ``vrh_interp.core.execution.remote`` is
reached.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import threading
import time
from typing import Iterator

import pytest

from tests.conftest import noise_image
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.execution.interventions import RemoteExecutionError
from vrh_interp.core.description.model import VLM, wrap
from vrh_interp.core.execution.remote import remote_timeouts, set_remote_timeouts
from tests.ndif_server import client_host, free_port
from vrh_interp.core.description.tiny import build_tiny

WS_MAGIC = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def tiny_remote_vlm() -> VLM:
    tiny = build_tiny("qwen2_vl")
    return wrap(tiny.model, tiny.processor, remote_id="vrh-interp/tiny-qwen2-vl")  # no hub call to name it


def _headers(conn: socket.socket) -> tuple[str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return lines[0], {k.lower(): v for k, v in fields.items()}, rest


def _answer(conn: socket.socket, silent_at: str) -> None:
    """One connection of the fake NDIF API: the websocket (handshake, session id) or the POST of the request;
    ``silent_at`` ("post" or "status") is where it stops answering (the connection stays open)."""
    request_line, fields, body = _headers(conn)
    if fields.get("upgrade", "").lower() == "websocket":
        accept = base64.b64encode(hashlib.sha1((fields["sec-websocket-key"] + WS_MAGIC).encode()).digest()).decode()
        conn.sendall(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode())
        payload = json.dumps({"session_id": "session-1"}).encode()
        conn.sendall(bytes([0x81, len(payload)]) + payload)  # one unmasked text frame; then silence
        return
    assert request_line.startswith("POST /request"), request_line
    while len(body) < int(fields["content-length"]):
        body += conn.recv(65536)
    if silent_at == "post":
        return
    reply = json.dumps({"id": "job-1", "status": "RECEIVED"}).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                 str(len(reply)).encode() + b"\r\n\r\n" + reply)


@contextlib.contextmanager
def server(mode: str) -> Iterator[str]:
    """A server on 127.0.0.1 that accepts connections; ``mode`` "never" answers nothing, "post" / "status"
    complete the handshake and go silent at that stage. Yields its URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    kept: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            kept.append(conn)
            if mode != "never":
                threading.Thread(target=_answer, args=(conn, mode), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        for conn in kept:
            conn.close()


@pytest.fixture
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VRH_REMOTE_CONNECT_TIMEOUT", "1")
    monkeypatch.setenv("VRH_REMOTE_READ_TIMEOUT", "1.5")


@pytest.mark.parametrize("mode, stage", [
    ("never", "did not answer within 1 s to accept the connection and answer the websocket handshake"),
    ("post", "did not answer within 1.5 s to the request (the read timeout, VRH_REMOTE_READ_TIMEOUT)"),
    ("status", "did not answer within 1.5 s with the job's next status (the read timeout"),
])
def test_a_silent_server_times_out_with_a_message_naming_the_host(short_timeouts: None, mode: str, stage: str) -> None:
    vlm = tiny_remote_vlm()
    batch = vlm.encode_grounding([noise_image(64, 48)], ["the red circle"])
    with server(mode) as host, client_host(host):
        started = time.monotonic()
        with pytest.raises(RemoteExecutionError) as raised:
            iv.run_forward(vlm.on(remote=True), batch.encoding)
        elapsed = time.monotonic() - started
    message = str(raised.value)
    assert f"the NDIF server at {host} {stage}" in message, message
    assert "vrh-interp/tiny-qwen2-vl" in message and "is an NDIF API" in message and "longer timeout" in message
    assert elapsed < 15, elapsed
    # the swap of nnsight's backend is undone: a later call builds nnsight's own class again
    from nnsight.intervention.backends import remote as module

    assert module.RemoteBackend.__name__ == "RemoteBackend" and module._READ_TIMEOUT == 600.0


def test_dns_failure_is_not_called_a_host_that_is_no_ndif_api() -> None:
    vlm = tiny_remote_vlm()
    batch = vlm.encode_grounding([noise_image(64, 48)], ["the red circle"])
    host = "http://no-such-host.invalid"  # .invalid never resolves (RFC 2606)
    with client_host(host), pytest.raises(RemoteExecutionError) as raised:
        iv.run_forward(vlm.on(remote=True), batch.encoding)
    message = str(raised.value)
    assert f"could not resolve the NDIF host {host}" in message and "spelling" in message, message
    assert "is this host an NDIF API" not in message


def test_timeouts_have_sensible_defaults_and_are_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VRH_REMOTE_CONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("VRH_REMOTE_READ_TIMEOUT", raising=False)
    monkeypatch.setattr("vrh_interp.core.execution.remote._configured", {})
    assert remote_timeouts() == (10.0, 600.0)
    monkeypatch.setenv("VRH_REMOTE_READ_TIMEOUT", "30")
    assert remote_timeouts() == (10.0, 30.0)
    set_remote_timeouts(connect=2)
    assert remote_timeouts() == (2.0, 30.0)
    for bad in (0, -1, float("nan"), "soon"):
        with pytest.raises(ValueError, match="positive number of seconds"):
            set_remote_timeouts(read=bad)  # type: ignore[arg-type]
    monkeypatch.setenv("VRH_REMOTE_READ_TIMEOUT", "ten")
    with pytest.raises(ValueError, match="VRH_REMOTE_READ_TIMEOUT must be a positive number of seconds, got 'ten'"):
        remote_timeouts()


def test_nothing_listening_is_still_a_refused_connection() -> None:
    vlm = tiny_remote_vlm()
    batch = vlm.encode_grounding([noise_image(64, 48)], ["the red circle"])
    host = f"http://127.0.0.1:{free_port()}"
    with client_host(host), pytest.raises(RemoteExecutionError, match="could not reach an NDIF server at " + host):
        iv.run_forward(vlm.on(remote=True), batch.encoding)


def test_the_installed_nnsight_has_every_private_name_the_timeouts_use() -> None:
    """Run on both ends of the allowed nnsight range by tests/version_ends.py."""
    from vrh_interp.core.execution.remote import check_remote_backend

    check_remote_backend()


def test_an_nnsight_without_a_private_name_is_refused_in_one_line() -> None:
    import types

    from nnsight.intervention.backends import remote as module

    from vrh_interp.core.execution.remote import UnsupportedNnsightError, check_remote_backend

    fake = types.SimpleNamespace(**{name: getattr(module, name) for name in dir(module) if name != "_REFRESH"})
    with pytest.raises(UnsupportedNnsightError, match=r"has no _REFRESH .*pip install 'nnsight>=0.8.0,<0.9'") as info:
        check_remote_backend(fake)
    assert "\n" not in str(info.value)
    backend = type("RemoteBackend", (), {})
    fake.RemoteBackend, fake._REFRESH = backend, 1.0
    with pytest.raises(UnsupportedNnsightError, match=r"RemoteBackend\._post, RemoteBackend\._serialize"):
        check_remote_backend(fake)
