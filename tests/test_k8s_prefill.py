"""The script of the Kubernetes weights pre-fill Job and of the engine pod's `weights-verified`
init container (filter_plugins/model_server.py K8S_PREFILL_SCRIPT, K8S_MARKER_SCRIPT), run with
/bin/sh on this machine against a real rsync daemon on loopback that serves a staging tree the
way roles/weights_sync's daemon does (module `weights`, user and password, read-only). The
"volume" is a temporary directory: the pod's /weights. Stand-in: no Kubernetes runs the Job.
"""
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "filter_plugins"))

import model_server as ms  # noqa: E402
from helpers import rsync_daemon  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import format_manifest  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed "
                                "(scripts/bootstrap.sh installs it)")
REPO = "MiniMaxAI/MiniMax-M3-MXFP8"
REVISION = "a" * 40
PASSWORD = "prefill-test-password-71c2"
FILES = {"config.json": b'{"model_type": "minimax_m3"}\n',
         "model-00001-of-00002.safetensors": os.urandom(300_000),
         "model-00002-of-00002.safetensors": os.urandom(200_000),
         "tokenizer/tokenizer.json": b'{"version": "1.0"}\n'}


def write_staging(root, files):
    """<root>/<repo>/<revision>/ and its manifest beside it, as weights_stage leaves them."""
    rev_dir = root / REPO / REVISION
    for name, data in files.items():
        (rev_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (rev_dir / name).write_bytes(data)
    text = format_manifest([(n, hashlib.sha256(d).hexdigest()) for n, d in files.items()],
                           {"repo": REPO, "revision": REVISION})
    (root / REPO / (REVISION + ".manifest.sha256")).write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture()
def staging(tmp_path):
    root = tmp_path / "staging"
    pin = write_staging(root, FILES)
    pw = tmp_path / "rsync.password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    volume = tmp_path / "volume"
    volume.mkdir()
    with rsync_daemon(str(tmp_path / "rsyncd"), str(root), PASSWORD) as port:
        yield {"root": root, "port": port, "pin": pin, "pw": pw, "volume": volume}


def prefill(staging, pin=None):
    env = {"PATH": os.environ["PATH"], "MM3_WEIGHTS_DIR": str(staging["volume"]),
           "MM3_PASSWORD_FILE": str(staging["pw"]), "MM3_REPO": REPO, "MM3_REVISION": REVISION,
           "MM3_MANIFEST_SHA256": pin or staging["pin"], "MM3_RSYNC_SERVER": "127.0.0.1",
           "MM3_RSYNC_PORT": str(staging["port"]), "MM3_RSYNC_USER": "weights", "MM3_BWLIMIT": "0"}
    return subprocess.run(["sh", "-c", ms.K8S_PREFILL_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)


def pod_starts(staging, pin=None):
    """The engine pod's init container, its /weights being the volume."""
    script = ms.K8S_MARKER_SCRIPT.replace("/weights/", str(staging["volume"]) + "/")
    env = {"PATH": os.environ["PATH"], "MM3_REVISION": REVISION, "MM3_MANIFEST_SHA256": pin or staging["pin"]}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def marker(staging):
    return staging["volume"] / (REVISION + ".verified")


def test_prefill_verifies_then_marks_and_the_pod_starts(staging):
    assert pod_starts(staging).returncode == 1  # an empty volume is never served
    result = prefill(staging)
    assert result.returncode == 0, result.stderr
    for name, data in FILES.items():
        assert (staging["volume"] / REVISION / name).read_bytes() == data
    lines = marker(staging).read_text().splitlines()
    assert lines[0] == staging["pin"]
    # then size, mtime, inode and name of every file, as they were when their bytes were checked
    listed = {line.split(" ", 3)[3][2:]: line.split(" ")[:3] for line in lines[1:]}
    assert sorted(listed) == sorted(FILES)
    shard = staging["volume"] / REVISION / "model-00001-of-00002.safetensors"
    st = shard.stat()
    assert listed["model-00001-of-00002.safetensors"] == [str(st.st_size), str(int(st.st_mtime)), str(st.st_ino)]
    assert pod_starts(staging).returncode == 0
    again = prefill(staging)  # a retried Job moves nothing
    assert again.returncode == 0 and "already verified" in again.stdout


def test_a_manifest_that_is_not_the_pinned_one_moves_nothing(staging):
    result = prefill(staging, pin="e" * 64)
    assert result.returncode == 2
    assert "not to the pinned " + "e" * 64 in result.stderr
    assert not (staging["volume"] / REVISION).exists() and not marker(staging).exists()


def test_a_changed_file_on_staging_is_never_marked_verified(staging):
    shard = staging["root"] / REPO / REVISION / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"\0" + shard.read_bytes()[1:])  # same manifest, other bytes
    result = prefill(staging)
    assert result.returncode == 3 and "does not match its pinned manifest" in result.stderr
    assert not marker(staging).exists()
    assert pod_starts(staging).returncode == 1


def test_a_file_the_manifest_does_not_list_is_never_marked_verified(staging):
    (staging["root"] / REPO / REVISION / "extra.py").write_text("import os\n")
    result = prefill(staging)
    assert result.returncode == 3 and "extra.py" in result.stderr
    assert not marker(staging).exists()


def _replace_keeping_size_and_mtime(path):
    """Other bytes under the name, with its size and mtime: a new file renamed over it."""
    st = path.stat()
    new = path.with_name(path.name + ".new")
    new.write_bytes(b"\0" * st.st_size)
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)


@pytest.mark.parametrize("change,named", [
    # bytes rewritten in place (any write moves the mtime)
    (lambda d: (d / "config.json").write_bytes(b'{"model_type": "other"}\n'), "config.json"),
    # a file replaced by another of the same size and mtime (only its inode tells)
    (lambda d: _replace_keeping_size_and_mtime(d / "tokenizer" / "tokenizer.json"), "tokenizer/tokenizer.json"),
    (lambda d: (d / "model-00002-of-00002.safetensors").unlink(), "a file that is gone"),
    (lambda d: (d / "extra.py").write_text("import os\n"), "extra.py"),
])
def test_a_volume_changed_after_the_prefill_does_not_start_the_pod(staging, change, named):
    """The marker holds what the pre-fill checked, not only the manifest hash (issue 32): a file
    written, replaced, removed or added in the volume since is refused, named, and a rerun of the
    Job checks the volume again instead of calling it verified."""
    assert prefill(staging).returncode == 0 and pod_starts(staging).returncode == 0
    change(staging["volume"] / REVISION)
    started = pod_starts(staging)
    assert started.returncode == 1 and "changed in this volume" in started.stderr, started.stderr
    assert named in started.stderr, started.stderr
    again = prefill(staging)
    assert "already verified" not in again.stdout


def test_a_stale_marker_of_another_pin_does_not_start_the_pod(staging):
    assert prefill(staging).returncode == 0
    assert pod_starts(staging, pin="f" * 64).returncode == 1


def test_the_volume_is_root_owned_and_readable_by_any_engine_user(staging):
    """Whatever staging's owner and modes (a shard 0640 of another user, a directory 0750), the
    pre-fill leaves directories 0755 and files 0644, owned by root, before it writes the marker:
    the engine (no capability, as root or serving_spec.container.user) reads them through the
    mode bits alone. A retried Job on a volume verified before sets them again, moving nothing."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    rev_dir = staging["root"] / REPO / REVISION
    os.chown(rev_dir / "model-00001-of-00002.safetensors", 1000, 1000)
    (rev_dir / "model-00001-of-00002.safetensors").chmod(0o640)
    os.chown(rev_dir / "tokenizer", 1000, 1000)
    (rev_dir / "tokenizer").chmod(0o750)
    volume_dir = staging["volume"] / REVISION

    def owners_and_modes():
        return {str(p.relative_to(volume_dir)): (oct(p.stat().st_mode & 0o7777), p.stat().st_uid, p.stat().st_gid)
                for p in [volume_dir] + sorted(volume_dir.rglob("*"))}

    assert prefill(staging).returncode == 0
    expected = {".": ("0o755", 0, 0), "tokenizer": ("0o755", 0, 0)}
    expected.update({name: ("0o644", 0, 0) for name in FILES})
    assert owners_and_modes() == expected
    os.chown(volume_dir / "model-00001-of-00002.safetensors", 1000, 1000)
    (volume_dir / "model-00001-of-00002.safetensors").chmod(0o600)
    again = prefill(staging)
    assert again.returncode == 0 and "already verified" in again.stdout
    assert owners_and_modes() == expected
