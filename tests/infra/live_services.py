"""Real services on 127.0.0.1 for the infra tests: a throwaway PostgreSQL cluster
and `mlflow server` processes that a test can start, kill and restart.

Nothing here is shared between tests: each cluster lives in its own temp folder
on a free port and is removed afterwards. `.ci/services.sh` only installs
Debian's PostgreSQL server binaries; this module finds them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import VENV_BIN, free_port

PG_USER = "tfmlops"
PG_DB = "mlflow"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: PATH, else Debian's /usr/lib/postgresql/<major>/bin."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")
             if (Path(p) / "initdb").exists() and (Path(p) / "pg_ctl").exists()]
    found.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


def require_postgres() -> Path:
    """The binaries, or a skip (locally) / a loud failure (CI: the test must not skip)."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        message = ("PostgreSQL server binaries (initdb, pg_ctl) not found; run .ci/services.sh "
                   "(installs Debian's postgresql) or `apt-get install postgresql`")
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return bin_dir


def _as_postgres_user() -> list[str]:
    """initdb and postgres refuse to run as root: drop to the `postgres` account."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        pytest.fail("running as root needs `runuser` (util-linux) to start PostgreSQL as `postgres`")
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres_cluster(password: str | None = None) -> Iterator[str]:
    """A fresh PostgreSQL cluster on a free port of 127.0.0.1; yields its SQLAlchemy URI
    (`postgresql+psycopg2://...`, what `mlflow server --backend-store-uri` takes), without
    the password. `password`: the user must give it (scram-sha-256), else trust auth.

    TFMLOPS_TEST_POSTGRES_URI, when set, names an existing database to use instead
    (tests then isolate themselves by experiment name).
    """
    external = os.environ.get("TFMLOPS_TEST_POSTGRES_URI")
    if external:
        yield external
        return
    bin_dir = require_postgres()
    sudo = _as_postgres_user()
    # Not under pytest's tmp_path: that folder is private to root, and the
    # server runs as `postgres` when the tests run as root.
    home = Path(tempfile.mkdtemp(prefix="tfmlops-pg-"))
    if sudo:
        shutil.chown(home, "postgres", "postgres")
    data, port = home / "data", free_port()

    env = {**os.environ, **({"PGPASSWORD": password} if password else {})}

    def pg(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([*sudo, *args], cwd=home, capture_output=True, text=True, timeout=120,
                              env=env)
        if check and proc.returncode != 0:
            log = (home / "server.log").read_text()[-3000:] if (home / "server.log").exists() else ""
            raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n"
                                 f"{proc.stderr}\n{log}")
        return proc

    auth = ["--auth=trust"]
    if password:
        pwfile = home / "pwfile"
        pwfile.write_text(password + "\n")
        if sudo:
            shutil.chown(pwfile, "postgres", "postgres")
        auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
    try:
        pg(str(bin_dir / "initdb"), "-D", str(data), "-U", PG_USER, *auth,
           "-E", "UTF8", "--no-locale")
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {home} -c fsync=off"
        pg(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(home / "server.log"), "-o", options,
           "-w", "-t", "60", "start")
        pg(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, PG_DB)
        # SQLAlchemy 2.1 defaults postgresql:// to psycopg 3; the test extra has psycopg2.
        yield f"postgresql+psycopg2://{PG_USER}@127.0.0.1:{port}/{PG_DB}"
    finally:
        if (data / "postmaster.pid").exists():
            pg(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(home, ignore_errors=True)


def libpq_uri(sqlalchemy_uri: str) -> str:
    """The same database for psycopg2.connect (no `+driver` in the scheme)."""
    scheme, rest = sqlalchemy_uri.split("://", 1)
    return f"{scheme.split('+')[0]}://{rest}"


class MlflowServer:
    """`mlflow server` as a real process group we can kill mid-run and restart."""

    def __init__(self, backend_uri: str, artifacts: Path, log_dir: Path, port: int | None = None):
        self.backend_uri = backend_uri
        self.artifacts = artifacts
        self.log_dir = log_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 240) -> MlflowServer:
        self.starts += 1
        log = self.log_dir / f"mlflow-server-{self.port}-{self.starts}.log"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        with log.open("w") as fh:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", self.backend_uri,
                 "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1"],
                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            if self.proc.poll() is not None:
                raise AssertionError(f"mlflow server exited {self.proc.returncode}:\n"
                                     f"{log.read_text()[-4000:]}")
            if self.healthy():
                return self
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"mlflow server not healthy after {timeout_s:.0f} s:\n"
                             f"{log.read_text()[-4000:]}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the whole group (the CLI and its uvicorn worker): a crash, not a shutdown."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        # The worker may outlive the group leader for a moment: wait for the port.
        give_up = time.monotonic() + 30
        while self.healthy() and time.monotonic() < give_up:
            time.sleep(0.2)


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path, log_dir: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(backend_uri, artifacts, log_dir)
    try:
        yield server.start()
    finally:
        server.kill()



class BasicAuthProxy:
    """A tracking server behind Basic auth, as a team puts one behind a reverse proxy: a
    threaded HTTP server on 127.0.0.1 that answers 401 unless the request carries
    `user:password`, and forwards everything else to `target` (an `mlflow server`).
    `broken`: every call but /health answers 503 (a server that is up, but failing)."""

    def __init__(self, target: str, user: str, password: str):
        import base64
        import http.server
        import socketserver
        import threading
        import urllib.parse

        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        upstream = urllib.parse.urlsplit(target)
        self.refused = 0  # requests answered 401
        self.broken = False
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # not on the test's stderr
                pass

            def _forward(self):
                import http.client

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != expected:
                    proxy.refused += 1
                    self._answer(401, {"WWW-Authenticate": 'Basic realm="mlflow"'}, b"")
                    return
                if proxy.broken and self.path != "/health":
                    self._answer(503, {}, b"failing")
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("authorization", "host", "connection")}
                conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    kept = {k: v for k, v in resp.getheaders()
                            if k.lower() not in ("transfer-encoding", "connection",
                                                 "content-length")}
                    self._answer(resp.status, kept, data)
                except OSError:
                    self._answer(502, {}, b"upstream unreachable")
                finally:
                    conn.close()

            def _answer(self, status: int, headers: dict, data: bytes):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def uri(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def __enter__(self) -> BasicAuthProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
