"""docker_engine refuses a bad apt source before anything changes on the host.

The role runs here against the controller itself in --check mode (so even a regression
could not install anything): the refusals happen in read-only tasks, before any change.
The "dead mirror" is a real TCP server on loopback that accepts and never answers, so the
test proves a timeout, not a hang.
"""
import socket
import threading
import time

import pytest
from helpers import run_role_check


@pytest.fixture
def silent_mirror():
    """A loopback port that accepts connections and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/debian"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def run_role(tmp_path, repo):
    start = time.monotonic()
    runner, out = run_role_check("docker_engine", {"docker_engine_apt_timeout": 3,
                                                   "docker_engine_apt_repository": repo}, tmp_path)
    return runner.rc, out, time.monotonic() - start


def test_dead_mirror_times_out_with_a_clear_message(tmp_path, silent_mirror):
    rc, out, seconds = run_role(tmp_path, {"url": silent_mirror, "suite": "bookworm",
                                           "signed_by": "/usr/share/keyrings/debian-archive-keyring.gpg"})
    assert rc != 0, out
    assert "did not answer" in out and "docker_engine_apt_repository.url" in out, out
    assert seconds < 120, f"took {seconds:.0f} s: a hang, not a 3 s timeout"


@pytest.mark.parametrize("repo, needle", [
    ({"url": "http://mirror.example/docker"}, "either `key_url` or `signed_by`"),
    ({"url": "ftp://mirror.example/docker", "signed_by": "/k.gpg"}, "needs an http(s) `url`"),
])
def test_incomplete_source_is_refused(tmp_path, repo, needle):
    rc, out, _ = run_role(tmp_path, repo)
    assert rc != 0, out
    assert needle in out, out
