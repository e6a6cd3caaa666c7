"""docker_engine refuses a bad apt source before anything changes on the host.

The role runs here against the controller itself in --check mode (so even a regression
could not install anything): the refusals happen in read-only tasks, before any change.
The "dead mirror" is a real TCP server on loopback that accepts and never answers, so the
test proves a timeout, not a hang.
"""
import pathlib
import socket
import threading
import time

import pytest
from helpers import failures, http_files, run_role_check


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
    ({"url": "http://mirror.example/docker"}, "docker_engine_apt_repository needs either `key_url`"),
    ({"url": "ftp://mirror.example/docker", "signed_by": "/k.gpg"}, "docker_engine_apt_repository needs an http(s) `url`"),
])
def test_incomplete_source_is_refused(tmp_path, repo, needle):
    rc, out, _ = run_role(tmp_path, repo)
    assert rc != 0, out
    assert needle in out, out


DOCKER_ASC = (pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "apt-keys" / "docker.asc").read_bytes()
# roles/apt_repository checks every key (check mode) before it writes any.
KEY_TASK = "Fetch the repository's signing key, trusted only if its fingerprint is pinned"
REFUSE_TASK = "Refuse a signing key that is not pinned or cannot be fetched (before anything changes)"


@pytest.fixture
def docker_mirror():
    """A real HTTP server on loopback laid out like a Docker CE mirror: dists/bookworm/Release
    and the signing key at /gpg (bytes chosen by the test)."""
    served = {"/docker/dists/bookworm/Release": b"Origin: Docker\nSuite: bookworm\n"}
    with http_files(served) as base:
        yield served, base + "/docker"


def key_results(runner):
    """How the key task ended (runner_on_ok / _failed / _skipped)."""
    return [e["event"] for e in runner.events
            if e.get("event", "") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped")
            and e["event_data"].get("task") == KEY_TASK]


def test_a_key_at_another_fingerprint_is_refused(tmp_path, docker_mirror):
    """Docker's real key is served, but the inventory pins another fingerprint (as if the
    mirror served another vendor's or its own key): refused before the key or the apt source is
    written (the fetch task never runs)."""
    served, url = docker_mirror
    served["/docker/gpg"] = DOCKER_ASC
    runner, out = run_role_check("docker_engine", {"docker_engine_apt_timeout": 3, "docker_engine_apt_repository": {
        "url": url, "suite": "bookworm", "key_url": url + "/gpg",
        "key_fingerprints": ["EB693B3035CD5710E231E123A4B469963BF863CC"]}}, tmp_path)
    assert runner.rc != 0 and key_results(runner) == [], out
    said = failures(runner).get(REFUSE_TASK) or ""
    assert said.startswith("docker_engine refuses: The signing key served at " + url + "/gpg is not trusted"), out
    assert "primary key(s) 9DC858229FC7DD38854AE2D88D81803C0EBFCD88 not pinned" in said, said
    assert "docker_engine_apt_repository.key_fingerprints" in said, said


def test_dockers_own_key_passes_the_role_pin(tmp_path, docker_mirror):
    """The same key with the role's default pin (Docker's published fingerprint) is accepted."""
    served, url = docker_mirror
    served["/docker/gpg"] = DOCKER_ASC
    runner, out = run_role_check("docker_engine", {"docker_engine_apt_timeout": 3, "docker_engine_apt_repository": {
        "url": url, "suite": "bookworm", "key_url": url + "/gpg"}}, tmp_path)
    assert key_results(runner) == ["runner_on_ok"], out
    assert not [msg for msg in failures(runner).values() if "not pinned" in str(msg)], out
