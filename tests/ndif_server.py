"""Start a real NDIF server on 127.0.0.1 (CPU only) for end-to-end tests of the remote path.

``LocalNDIF`` runs the open-source NDIF stack (PyPI ``ndif`` 0.1.2) as separate processes: redis, an S3
stand-in (``moto_server``), a Ray head, the ndif controller, and the ndif API (gunicorn + its queue
dispatcher), every one bound to 127.0.0.1 on a free port. ``deploy`` serves a ``save_pretrained`` folder
under a hub-style id through a CPU model actor. ``stop`` ends every process it started by PID and removes
its temporary folder: each service is started in its own process group, and a sweep finds the rest (Ray
re-parents its daemons out of those groups) by a per-instance marker in their environment or a working
directory inside the temp folder. A watchdog process does the same if the starting process dies without
calling ``stop`` (SIGKILL, a killed CI job).

Design choices (the measured facts behind them are in the project's reference notes on NDIF):

- The server runs in ITS OWN Python environment (``server_python``), not the test's: vrh_interp must not be
  importable there, so the test proves that trace templates run on a server without vrh_interp installed
  (``nnsight.register("vrh_interp")`` ships them by value). ``create_server_venv`` builds that environment;
  ``server_python()`` finds it (``$VRH_NDIF_PYTHON``, else ``~/.cache/vrh-interp/ndif-venv``).
- Every server process gets a minimal environment built here (no inherited ``PYTHONPATH``, cwd in the temp
  folder); the only extra import path is a temp folder holding a copy of ``ndif_cpu_actor.py`` (the CPU actor
  subclass, which imports no vrh_interp) as the top-level module ``vrh_ndif_cpu_actor``.
- The stock actor needs CUDA and the controller only manages nodes with a GPU resource: the Ray head
  advertises one fake GPU (``--num-gpus=1`` plus ``cuda_memory_bytes``) while the actor loads on CPU.
- ndif 0.1.2's hub-based sizing is incompatible with nnsight 0.8.1, so ``deploy`` passes an explicit model
  key and ``size_bytes``; the model is read offline (``HF_HUB_OFFLINE=1``) from an HF-cache layout in the
  temp folder.
- Ray replaces a 127.0.0.1 node address with the host's routable IP and then listens there and on all
  interfaces; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (its single-machine mode) keeps every listener on
  loopback.
- Auth is off (no ``NDIF_POSTGRES_URL``): no API key exists anywhere in this harness.
- Anything missing (server environment, ``redis-server``) raises ``NDIFUnavailable`` with a precise reason
  for the caller to skip on; a piece that is present but fails to start raises ``NDIFStartError`` (a real
  failure, with the tail of that process's log).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

SERVER_PYTHON_ENV = "VRH_NDIF_PYTHON"
ACTOR_MODULE = "vrh_ndif_cpu_actor"
ACTOR_CLASS = f"{ACTOR_MODULE}.CPUModelActor"
MARKER_ENV = "VRH_NDIF_HARNESS_ID"
PROBE_DIR_ENV = "VRH_NDIF_PROBE_DIR"

# What the server environment pins (the same versions the client uses; ndif declares Python >= 3.12 but
# works on 3.11, hence --ignore-requires-python). torch is pinned: an unpinned torch pulls a CUDA build.
SERVER_REQUIREMENTS: tuple[tuple[str, ...], ...] = (
    ("torch==2.13.0",),
    ("transformers==5.24.0", "nnsight==0.8.1", "pillow", "moto[server]"),
    # ray pinned: Ray 2.60 (resolved unpinned on 2026-12-02) turns on token authentication by default and the
    # controller then fails to reach the GCS ("InvalidAuthToken"); 2.49.2 predates that
    ("--ignore-requires-python", "ndif[api,ray]==0.1.2", "ray==2.49.2"),
)
_SERVER_IMPORTS = ("ndif", "ray", "moto", "nnsight", "transformers", "torch", "gunicorn", "PIL")


# Run by a watchdog process: if the process that started the stack dies without ``stop`` (SIGKILL, a killed
# CI job), end the recorded process groups (``<root>/pgids``) and every process carrying the marker, then
# remove the temp folder. argv: parent pid, marker, root.
_REAPER = r"""
import os, shutil, signal, sys, time
parent, marker, root = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return False
def marked():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cwd = os.readlink(f"/proc/{name}/cwd")
                with open(f"/proc/{name}/environ", "rb") as f:
                    if b"VRH_NDIF_HARNESS_ID=" + marker in f.read().split(b"\0") or cwd.startswith(root + "/") \
                            or cwd in (root, root + " (deleted)"):
                        out.append(int(name))
            except OSError:
                pass
    return out
def groups():
    try:
        with open(os.path.join(root, "pgids")) as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []
while alive(parent):
    time.sleep(1)
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pgid in groups():
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for pid in marked():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    time.sleep(3)
shutil.rmtree(root, ignore_errors=True)
"""


class NDIFUnavailable(RuntimeError):
    """A piece of the local NDIF stack is not installed here; the message says which and how to add it."""


class NDIFStartError(RuntimeError):
    """A piece of the local NDIF stack is installed but failed to start or to deploy a model."""


def default_server_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vrh-interp" / "ndif-venv"


def server_python() -> Path:
    """The server environment's interpreter: ``$VRH_NDIF_PYTHON``, else the default venv's."""
    configured = os.environ.get(SERVER_PYTHON_ENV)
    return Path(configured) if configured else default_server_venv() / "bin" / "python"


def create_server_venv(path: str | os.PathLike[str] | None = None, *, python: str = sys.executable) -> Path:
    """Create the server environment (a venv WITHOUT vrh_interp) and return its interpreter.

    ~1 min with local wheels. ``python -m tests.ndif_server create-venv [PATH]`` does the same.
    """
    venv = Path(path) if path is not None else default_server_venv()
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    interpreter = venv / "bin" / "python"
    subprocess.run([str(interpreter), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    for group in SERVER_REQUIREMENTS:
        subprocess.run([str(interpreter), "-m", "pip", "install", "-q", *group], check=True)
    return interpreter


def check_prerequisites(python: Path | None = None) -> Path:
    """Return the server interpreter, or raise ``NDIFUnavailable`` naming exactly what is missing."""
    python = python or server_python()
    how = (f"create it with `python -m tests.ndif_server create-venv` "
           f"(or point ${SERVER_PYTHON_ENV} at a Python with ndif[api,ray]==0.1.2, moto[server], nnsight==0.8.1)")
    if not python.exists():
        raise NDIFUnavailable(f"no NDIF server environment: {python} does not exist; {how}")
    _redis_server()
    probe = ("import importlib.util as u, json; "
             f"print(json.dumps({{m: u.find_spec(m) is not None "
             f"for m in {list(_SERVER_IMPORTS) + ['vrh_interp']!r}}}))")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60,
                          env=_base_env(python), cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise NDIFUnavailable(f"the NDIF server environment {python} does not run: {done.stderr.strip()[-400:]}")
    found = json.loads(done.stdout)
    missing = [m for m in _SERVER_IMPORTS if not found[m]]
    if missing:
        raise NDIFUnavailable(f"the NDIF server environment {python} lacks {missing}; {how}")
    if found["vrh_interp"]:
        raise NDIFUnavailable(f"vrh_interp is importable in the NDIF server environment {python}; the server "
                              "must not have it (use a separate venv)")
    return python


def _redis_server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise NDIFUnavailable("redis-server is not on PATH (Debian: `apt-get install -y redis-server`)")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _base_env(python: Path) -> dict[str, str]:
    """A minimal environment for server processes: the server venv first on PATH, nothing else inherited."""
    path = os.pathsep.join([str(python.parent), "/usr/local/bin", "/usr/bin", "/bin"])
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "PYTHONNOUSERSITE": "1"}
    if "TMPDIR" in os.environ:
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalNDIF:
    """A local NDIF stack. Use as a context manager (``stop`` runs even when the body fails)."""

    python: Path = field(default_factory=server_python)
    ready_timeout_s: float = 90.0
    deploy_timeout_s: float = 120.0
    root: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    _procs: list[_Proc] = field(default_factory=list)
    _reaper: subprocess.Popen[bytes] | None = None
    _marker: str = field(default_factory=lambda: uuid.uuid4().hex)

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> "LocalNDIF":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def probe_dir(self) -> Path:
        assert self.root is not None
        return self.root / "probe"

    def start(self) -> None:
        self.python = check_prerequisites(self.python)
        self.root = Path(tempfile.mkdtemp(prefix="vrh-ndif-"))
        for sub in ("logs", "actor", "probe", "hf/hub", "ray", "redis"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(__file__).with_name("ndif_cpu_actor.py"), self.root / "actor" / f"{ACTOR_MODULE}.py")
        # The watchdog has no marker itself, and is stopped first by stop().
        self._reaper = subprocess.Popen(
            [str(self.python), "-c", _REAPER, str(os.getpid()), self._marker, str(self.root)],
            env=_base_env(self.python), cwd=self.root, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name in ("redis", "s3", "gcs", "client", "dashboard", "agent_grpc", "agent_http", "metrics",
                     "object_manager", "node_manager", "runtime_env", "api"):
            self.ports[name] = free_port()
        p = self.ports
        self._spawn("redis", [_redis_server(), "--bind", "127.0.0.1", "--port", str(p["redis"]), "--save", "",
                              "--appendonly", "no", "--set-proc-title", "no", "--dir", str(self.root / "redis")])
        self._spawn("s3", [str(self.python.parent / "moto_server"), "-H", "127.0.0.1", "-p", str(p["s3"])])
        self._wait_tcp("redis", p["redis"])
        self._wait_tcp("s3", p["s3"])
        resources = json.dumps({"head": 10, "cuda_memory_bytes": 8_000_000_000, "cpu_memory_bytes": 8_000_000_000})
        self._spawn("ray", [
            str(self.python.parent / "ray"), "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", f"--port={p['gcs']}", "--num-cpus=4", "--num-gpus=1",
            f"--resources={resources}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={p['dashboard']}", f"--dashboard-agent-grpc-port={p['agent_grpc']}",
            f"--dashboard-agent-listen-port={p['agent_http']}", f"--metrics-export-port={p['metrics']}",
            f"--object-manager-port={p['object_manager']}", f"--node-manager-port={p['node_manager']}",
            f"--runtime-env-agent-port={p['runtime_env']}", f"--ray-client-server-port={p['client']}",
            f"--temp-dir={self.root / 'ray'}",
        ])
        self._wait_tcp("ray", p["client"])
        # The controller launcher schedules a detached actor on the head, then exits.
        launcher = self._spawn("controller",
                               [str(self.python), "-m", "ndif.services.ray.deployments.controller.controller"],
                               extra={"RAY_ADDRESS": f"127.0.0.1:{p['gcs']}"})
        self._wait_exit(launcher, timeout_s=self.ready_timeout_s)
        self._spawn("api", [str(self.python.parent / "gunicorn"), "--config", "python:ndif.services.api.gunicorn_conf",
                            "--bind", f"127.0.0.1:{p['api']}", "ndif.services.api.app:app"])
        self._wait_http(f"{self.host}/connected", "api")

    def stop(self) -> None:
        """End every process this instance started (reverse order), by PID; then remove the temp folder."""
        if self._reaper is not None:
            _terminate([self._reaper], marker=None, grace_s=2.0)
            self._reaper = None
        _terminate([proc.popen for proc in reversed(self._procs)], self._marker, self.root)
        self._procs.clear()
        if self.root is not None and os.environ.get("VRH_NDIF_KEEP_LOGS") is None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # ---------------------------------------------------------------- models
    def deploy(self, model_key: str, folder: str | os.PathLike[str], *, dtype: str = "float32") -> None:
        """Serve ``folder`` (a ``save_pretrained`` checkpoint) under ``model_key`` (a client's ``to_model_key()``).

        The key's ``repo_id`` names where the folder is laid out in the server's offline HF cache, so the
        server resolves the same id the client sends. Blocks until the replica is ready.
        """
        assert self.root is not None, "start the server first"
        suffix = json.loads(model_key.split(":", 1)[1])
        repo_id = suffix["repo_id"]
        if suffix.get("revision") not in (None, "main"):
            raise ValueError("deploy lays out the 'main' revision only")
        size = _layout_hf_cache(Path(folder), self.root / "hf" / "hub", repo_id)
        # size_bytes only sizes the placement on the fake GPU: the files' size x4 covers fp16 files held in fp32.
        spec = {"checkpoint": repo_id, "model_key": model_key, "size_bytes": size * 4, "pinned": True,
                "dtype": dtype, "task": suffix.get("task"), "execution_timeout_seconds": 300}
        log = self.root / "logs" / "deploy.log"
        with open(log, "ab") as handle:
            try:
                done = subprocess.run([str(self.python), "-m", ACTOR_MODULE, "deploy", json.dumps(spec)],
                                      stdout=subprocess.PIPE, stderr=handle, env=self._env(), cwd=self.root,
                                      timeout=self.deploy_timeout_s, start_new_session=True)
            except subprocess.TimeoutExpired as err:
                raise NDIFStartError(f"deploying {repo_id} took over {self.deploy_timeout_s:.0f} s\n"
                                     f"{_tail(log)}") from err
        if done.returncode != 0:
            raise NDIFStartError(f"deploying {repo_id} failed: {done.stdout.decode()[-1500:]}\n{_tail(log)}")

    def probe(self) -> dict[str, object]:
        """What the model actor's process could import (written by the actor when it loaded the model)."""
        return json.loads((self.probe_dir / "probe.json").read_text())

    def logs(self) -> str:
        """The tail of every service log (for a failing test's report)."""
        if self.root is None:
            return ""
        return "\n".join(f"--- {p.name}\n{_tail(p)}" for p in sorted((self.root / "logs").glob("*.log")))

    # ---------------------------------------------------------------- internals
    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        assert self.root is not None
        p = self.ports
        env = _base_env(self.python)
        env.update({
            MARKER_ENV: self._marker,
            PROBE_DIR_ENV: str(self.probe_dir),
            "PYTHONPATH": str(self.root / "actor"),
            "HF_HOME": str(self.root / "hf"),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "GRPC_ENABLE_FORK_SUPPORT": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray swaps a 127.0.0.1 node address for the host's routable IP unless told this is a
            # single-machine "cluster" (its Windows/macOS mode): keeps its listeners on loopback.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "NDIF_REDIS_URL": f"redis://127.0.0.1:{p['redis']}",
            "NDIF_OBJECT_STORE_URL": f"http://127.0.0.1:{p['s3']}",
            "NDIF_OBJECT_STORE_ACCESS_KEY": "testing",
            "NDIF_OBJECT_STORE_SECRET_KEY": "testing",
            "NDIF_RAY_ADDRESS": f"ray://127.0.0.1:{p['client']}",
            "NDIF_MODEL_IMPORT_PATH": ACTOR_CLASS,
            "NDIF_DEFAULT_DTYPE": "float32",
            "NDIF_INFLUX_ENABLED": "false",
            "NDIF_API_WORKERS": "1",
            "NDIF_CONTROLLER_SYNC_INTERVAL_S": "5",
        })
        env.update(extra or {})
        return env

    def _spawn(self, name: str, argv: Sequence[str], extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        assert self.root is not None
        log = self.root / "logs" / f"{name}.log"
        with open(log, "ab") as handle:
            popen = subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self._env(extra), cwd=self.root, start_new_session=True)
        self._procs.append(_Proc(name, popen, log))
        with open(self.root / "pgids", "a", encoding="utf-8") as handle:  # for the watchdog
            handle.write(f"{popen.pid}\n")
        return popen

    def _proc(self, name: str) -> _Proc:
        return next(p for p in self._procs if p.name == name)

    def _fail(self, name: str, what: str) -> NDIFStartError:
        return NDIFStartError(f"{name}: {what}\n{_tail(self._proc(name).log)}")

    def _wait_tcp(self, name: str, port: int) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc(name).popen.poll() is not None:
                raise self._fail(name, f"exited with status {self._proc(name).popen.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return
            time.sleep(0.2)
        raise self._fail(name, f"port {port} not open after {self.ready_timeout_s:.0f} s")

    def _wait_exit(self, popen: subprocess.Popen[bytes], timeout_s: float) -> None:
        name = next(p.name for p in self._procs if p.popen is popen)
        try:
            status = popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise self._fail(name, f"still running after {timeout_s:.0f} s") from err
        if status != 0:
            raise self._fail(name, f"exited with status {status}")

    def _wait_http(self, url: str, name: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc(name).popen.poll() is not None:
                raise self._fail(name, f"exited with status {self._proc(name).popen.returncode}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            time.sleep(0.3)
        raise self._fail(name, f"{url} did not answer 200 within {self.ready_timeout_s:.0f} s")


def _layout_hf_cache(folder: Path, hub: Path, repo_id: str) -> int:
    """Copy ``folder`` into an offline HF hub cache as ``repo_id`` at revision ``main``; return its bytes."""
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} is not a save_pretrained folder (no config.json)")
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return sum(f.stat().st_size for f in snapshot.rglob("*") if f.is_file())


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _terminate(popens: Sequence[subprocess.Popen[bytes]], marker: str | None, root: Path | None = None,
               grace_s: float = 3.0) -> None:
    """SIGTERM every process group we lead and every marked process, wait ``grace_s``, then SIGKILL the rest.

    Each child was started in its own session, so its PID is its process group (gunicorn's dispatcher,
    ``ray start --block``'s children). Ray daemons that leave the group are found by the marker.
    """
    def signal_all(sig: int) -> list[int]:
        for popen in popens:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, sig)
        pids = marked_pids(marker, root)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return pids

    pids = signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if all(p.poll() is not None for p in popens) and \
                not any(_alive(pid) for pid in pids + marked_pids(marker, root)):
            break
        time.sleep(0.1)
    signal_all(signal.SIGKILL)
    for popen in popens:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=grace_s)
    deadline = time.monotonic() + grace_s
    while marked_pids(marker, root) and time.monotonic() < deadline:
        time.sleep(0.1)


def marked_pids(marker: str | None, root: Path | None = None) -> list[int]:
    """Live PIDs started by one harness instance: the marker in their environment, or a cwd in its folder.

    Both, because neither alone is enough: Ray re-parents its daemons out of our process groups, and some
    processes overwrite their environment block when they set their title (Ray's dashboard heads).
    """
    if not marker:
        return []
    needle = f"{MARKER_ENV}={marker}".encode()
    inside = f"{root}/" if root is not None else None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
            ours = inside is not None and (cwd + "/").startswith(inside) or \
                needle in (entry / "environ").read_bytes().split(b"\0")
            if ours and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return False


@contextlib.contextmanager
def client_host(host: str) -> Iterator[None]:
    """Point nnsight's client at ``host`` for the block (no API key is sent: the local server has auth off).

    Restores the previous host and key afterwards; the key is never read out, printed or written.
    """
    import nnsight

    api = nnsight.CONFIG.API
    saved_host, saved_key = api.HOST, api.APIKEY
    api.HOST, api.APIKEY = host, None
    try:
        yield
    finally:
        api.HOST, api.APIKEY = saved_host, saved_key


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["create-venv"]:
        print(create_server_venv(args[1] if len(args) > 1 else None))
        return 0
    if args[:1] == ["check"]:
        try:
            print(check_prerequisites())
        except NDIFUnavailable as err:
            print(f"unavailable: {err}")
            return 1
        return 0
    print("usage: python -m tests.ndif_server {create-venv [PATH] | check}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
