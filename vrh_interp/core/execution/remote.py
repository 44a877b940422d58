"""Connect and read timeouts on every remote (NDIF) call.

nnsight 0.8.1's blocking ``RemoteBackend`` opens its ``/subscribe`` websocket without a timeout and then waits on
it without one, so a host that accepts the connection and never answers hangs the run forever; its HTTP calls
use 10 s to connect and 600 s to read. Inside ``timed_remote_calls`` (which ``interventions.remote_errors``
enters around every remote call of the library) nnsight builds ``TimedRemoteBackend`` instead, with:

* ``connect`` (default 10 s): TCP connect, websocket handshake and the server's session id, and every HTTP
  connect. A live server answers these at once, whatever its load.
* ``read`` (default 600 s, nnsight's own HTTP read timeout): the longest silence allowed while waiting for an
  HTTP response or for the job's next status message (the server reports each stage: received, queued,
  running, completed). A job that runs longer than this without a status message needs a larger value.

Set them with ``set_remote_timeouts(connect=..., read=...)`` or the environment (``VRH_REMOTE_CONNECT_TIMEOUT``,
``VRH_REMOTE_READ_TIMEOUT``, seconds; the CLI reads these). A timeout raises ``RemoteTimeoutError`` naming the
host and the stage, which ``remote_errors`` turns into a ``RemoteExecutionError`` that says what to check.

This is the one place that relies on a private detail of nnsight (the 0.8 series, ``nnsight>=0.8.0,<0.9`` in
pyproject.toml): the swap replaces the module attributes ``RemoteBackend``, ``_CONNECT_TIMEOUT`` and
``_READ_TIMEOUT`` for the duration of the call only, and the subclass uses the backend's private methods.
``check_remote_backend`` names every private attribute used and refuses, in one line naming the installed
version, a layout without them (rather than a deep ``AttributeError`` mid-run); ``tests/test_remote_timeouts.py``
checks the swap against a socket that accepts and never answers, on both ends of the allowed range
(``tests/version_ends.py``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from typing import Any, Iterator

DEFAULT_CONNECT_S = 10.0
DEFAULT_READ_S = 600.0
ENV = {"connect": "VRH_REMOTE_CONNECT_TIMEOUT", "read": "VRH_REMOTE_READ_TIMEOUT"}
_configured: dict[str, float] = {}


class RemoteTimeoutError(TimeoutError):
    """The remote host did not answer within a timeout; ``host``, ``stage`` and ``seconds`` say where."""

    def __init__(self, host: str, stage: str, kind: str, seconds: float) -> None:
        super().__init__(f"the NDIF server at {host} did not answer within {seconds:g} s {stage} (the {kind} "
                         f"timeout, {ENV[kind]})")
        self.host, self.stage, self.kind, self.seconds = host, stage, kind, seconds


def _positive(value: Any, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{where} must be a positive number of seconds, got {value!r}")
    return seconds


def set_remote_timeouts(connect: float | None = None, read: float | None = None) -> None:
    """Set the connect and / or read timeout (seconds) of every later remote call in this process."""
    for kind, value in (("connect", connect), ("read", read)):
        if value is not None:
            _configured[kind] = _positive(value, f"the remote {kind} timeout")


def remote_timeouts() -> tuple[float, float]:
    """``(connect, read)`` in seconds: ``set_remote_timeouts``, else the environment, else the defaults."""
    values = []
    for kind, default in (("connect", DEFAULT_CONNECT_S), ("read", DEFAULT_READ_S)):
        if kind in _configured:
            values.append(_configured[kind])
        elif os.environ.get(ENV[kind], "").strip():
            values.append(_positive(os.environ[ENV[kind]], ENV[kind]))
        else:
            values.append(default)
    return values[0], values[1]


# the private names of nnsight.intervention.backends.remote that the swap uses (module attributes, then methods
# and attributes of RemoteBackend instances, the latter set in __init__ and so checked on the class's source)
PRIVATE_MODULE_NAMES = ("RemoteBackend", "RemoteError", "_CONNECT_TIMEOUT", "_READ_TIMEOUT", "_REFRESH")
PRIVATE_BACKEND_NAMES = ("_post", "_serialize", "send", "parse", "handle", "request")


class UnsupportedNnsightError(RuntimeError):
    """The installed nnsight's remote backend lacks a private name the timeouts rely on."""


def check_remote_backend(module: Any = None) -> None:
    """Refuse (``UnsupportedNnsightError``, one line) an nnsight whose remote backend lacks a name the swap uses."""
    if module is None:
        from nnsight.intervention.backends import remote as module
    missing = [name for name in PRIVATE_MODULE_NAMES if not hasattr(module, name)]
    backend = getattr(module, "RemoteBackend", None)
    missing += [f"RemoteBackend.{name}" for name in PRIVATE_BACKEND_NAMES
                if backend is not None and not callable(getattr(backend, name, None))]
    if missing:
        from importlib.metadata import version

        raise UnsupportedNnsightError(
            f"nnsight {version('nnsight')} has no {', '.join(missing)} in nnsight.intervention.backends.remote, "
            "which vrh-interp's remote timeouts use: install a supported nnsight (pip install 'nnsight>=0.8.0,<0.9')")


@functools.cache
def _timed_class(base: type) -> type:
    """``base`` (nnsight's ``RemoteBackend``) with the timeouts of ``remote_timeouts`` on the websocket."""
    import httpx
    import websocket
    from nnsight.intervention.backends import remote as module
    from nnsight.schema.response import Status

    class TimedRemoteBackend(base):  # type: ignore[misc, valid-type]
        def _post(self, request: Any, blob: bytes) -> Any:
            try:
                return super()._post(request, blob)
            except module.RemoteError as error:
                if not isinstance(error.__cause__, httpx.TimeoutException):
                    raise
                connect, read = remote_timeouts()
                if isinstance(error.__cause__, httpx.ConnectTimeout):
                    raise RemoteTimeoutError(self.host, "to the request", "connect", connect) from error
                raise RemoteTimeoutError(self.host, "to the request", "read", read) from error

        def request(self, request: Any, tracer: Any) -> Any:
            """nnsight's ``request`` (subscribe, post, wait for COMPLETED) with the timeouts."""
            connect, read = remote_timeouts()
            blob = self._serialize(tracer)
            try:
                connection = websocket.create_connection(
                    f"{self.ws_host}/subscribe", header={"ndif-api-key": self.api_key} if self.api_key else None,
                    timeout=connect)
            except (websocket.WebSocketTimeoutException, TimeoutError) as error:
                raise RemoteTimeoutError(self.host, "to accept the connection and answer the websocket handshake",
                                         "connect", connect) from error
            try:
                try:
                    request.session_id = json.loads(connection.recv())["session_id"]
                except (websocket.WebSocketTimeoutException, TimeoutError) as error:
                    raise RemoteTimeoutError(self.host, "with a session id", "connect", connect) from error
                self.send(request, blob)
                connection.settimeout(min(module._REFRESH, read) if self.display.enabled else read)
                heard = time.monotonic()
                while True:
                    try:
                        message = connection.recv()
                    except websocket.WebSocketTimeoutException as error:
                        if time.monotonic() - heard >= read:
                            raise RemoteTimeoutError(self.host, "with the job's next status", "read", read) from error
                        self.display.refresh()
                        continue
                    heard = time.monotonic()
                    response = self.parse(message)
                    result = self.handle(response)
                    if response.status == Status.COMPLETED:
                        return result
            finally:
                connection.close()

    return TimedRemoteBackend


@contextlib.contextmanager
def timed_remote_calls() -> Iterator[None]:
    """Within: every remote call nnsight makes has the connect and read timeouts of ``remote_timeouts``."""
    from nnsight.intervention.backends import remote as module

    check_remote_backend(module)
    connect, read = remote_timeouts()
    saved = module.RemoteBackend, module._CONNECT_TIMEOUT, module._READ_TIMEOUT
    base = saved[0].__mro__[1] if saved[0].__name__ == "TimedRemoteBackend" else saved[0]  # nested calls
    module.RemoteBackend, module._CONNECT_TIMEOUT, module._READ_TIMEOUT = _timed_class(base), connect, read
    try:
        yield
    finally:
        module.RemoteBackend, module._CONNECT_TIMEOUT, module._READ_TIMEOUT = saved
