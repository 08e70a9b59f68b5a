"""A real PostgreSQL server for the tests: started on 127.0.0.1 at a free port, its data in a temporary folder, with
``initdb`` and ``postgres`` from PATH (Debian's ``postgresql`` package puts them in /usr/lib/postgresql/N/bin; a
link on PATH will do), else the binaries of the ``pgserver`` wheel (``pgserver/pginstall/bin``, installed by the
``test`` extra). The server never is skipped: a test that needs one and cannot start it fails, saying why.

PostgreSQL refuses to run as root: under root (a CI container) the server runs as ``nobody``, from a copy of the
binaries it can read when the wheel's lie under a private home. Every test gets a database of its own
(:meth:`Server.database`); the server lives for the session of one test process.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

USER, PASSWORD = "tunekit", "s3cret-pw"
"""The server's superuser; the password is checked (scram-sha-256 over TCP), and no output may show it."""
_START_S = 60.0


def binaries() -> Path:
    """The folder of initdb and postgres: PATH's, else the pgserver wheel's.

    Raises:
        RuntimeError: neither is there.
    """
    found = [shutil.which(name) for name in ("initdb", "postgres")]
    if all(found):
        return Path(os.path.realpath(found[0])).parent  # type: ignore[arg-type]
    spec = importlib.util.find_spec("pgserver")  # not imported: only its files are needed
    if spec is not None and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (folder / "initdb").exists():
            return folder
    raise RuntimeError(
        "no PostgreSQL server binaries: initdb and postgres are not on PATH and the pgserver wheel is not "
        "installed; pip install -e '.[test]' installs pgserver (or apt-get install postgresql)"
    )


@dataclass
class Server:
    """A running server: ``url(db)`` connects to one of its databases with the password."""

    port: int
    folder: Path
    process: subprocess.Popen[Any]

    def url(self, database: str = "postgres", password: str | None = PASSWORD) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new, empty database's URL (password included)."""
        import psycopg2

        name = f"t_{uuid.uuid4().hex[:12]}"
        conn = psycopg2.connect(self.url())
        try:
            conn.autocommit = True  # CREATE DATABASE runs outside a transaction
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {name}")
        finally:
            conn.close()
        return self.url(name)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # a fast shutdown
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> dict[str, Any]:
    """Popen's arguments that run the server as ``nobody`` under root, else nothing."""
    if os.geteuid() != 0:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


def _usable(bin_dir: Path, folder: Path, who: dict[str, Any]) -> Path:
    """The binaries' folder as the server's user can run them: a copy of their installation in ``folder`` when
    that user cannot read them where they are."""
    try:
        if subprocess.run([str(bin_dir / "initdb"), "--version"], capture_output=True, **who).returncode == 0:
            return bin_dir
    except PermissionError:  # a folder on the way is closed to that user
        pass
    # the wheel's binaries find their libraries at $ORIGIN/../../../pgserver.libs: the copy keeps that layout
    site = folder / "site"
    install = bin_dir.parent
    for part in ("bin", "lib", "share"):
        if (install / part).is_dir():
            shutil.copytree(install / part, site / install.parent.name / install.name / part, symlinks=True)
    for libs in install.parents[1].glob("*.libs"):
        shutil.copytree(libs, site / libs.name, symlinks=True)
    subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)
    return site / install.parent.name / install.name / "bin"


def _run(cmd: list[str], who: dict[str, Any], log: Path) -> None:
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **who)
    if done.returncode != 0:
        log.write_text(done.stdout)
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({done.returncode}): {done.stdout.strip()[-800:]}")


def start() -> Server:
    """Initialise a cluster in a new temporary folder and start its server on a free loopback port.

    Raises:
        RuntimeError: the binaries are missing, initdb fails, or the server does not accept connections within
            a minute (the log's tail in the message).
    """
    who = _as_user()
    found = binaries()
    folder = Path(tempfile.mkdtemp(prefix="tunekit-pg-"))
    try:
        return _start(found, folder, who)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _start(found: Path, folder: Path, who: dict[str, Any]) -> Server:
    if who:
        os.chown(folder, who["user"], who["group"])
    bin_dir = _usable(found, folder, who)
    data, pwfile = folder / "data", folder / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if who:
        os.chown(pwfile, who["user"], who["group"])
    init = [str(bin_dir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}", "-E", "UTF8"]
    _run([*init, "--auth-host=scram-sha-256", "--auth-local=trust", "--no-sync"], who, folder / "initdb.log")
    for _ in range(3):  # a free port can be taken before the server binds it
        port = _free_port()
        log = open(folder / "server.log", "ab")
        process = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(data)]
            + ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **who,
        )
        log.close()
        server = Server(port, folder, process)
        if _ready(server):
            return server
        if process.poll() is None:
            process.kill()
        process.wait()
    tail = (folder / "server.log").read_text(errors="replace")[-1500:]
    raise RuntimeError(f"PostgreSQL did not start in {_START_S:.0f} s (3 ports tried); its log ends: {tail}")


def _ready(server: Server) -> bool:
    import psycopg2

    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline and server.process.poll() is None:
        try:
            psycopg2.connect(server.url(), connect_timeout=2).close()
            return True
        except psycopg2.OperationalError:
            time.sleep(0.2)
    return False


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    """A real PostgreSQL server for this test process (fails, never skips, when it cannot start)."""
    server = start()
    try:
        yield server
    finally:
        server.stop()
