"""The transfer check of roles/weights_sync's daemons (templates/verified-only.sh.j2, rsyncd's
`pre-xfer exec` of the module `weights`), rendered as the role renders it and run by a real
rsync daemon on loopback: a revision is served only while its verified marker is beside it, so
a host (staging, or a node serving the fan-out) never serves a revision that a later
verification refused, whatever the module's filter still lists. The request format
(RSYNC_REQUEST = module/path, space-separated) is rsync 3.2.7's, as recorded on this machine.
"""
import os
import pathlib
import shutil
import subprocess

import jinja2
import pytest

from helpers import ROOT, rsync_daemon

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed "
                                "(scripts/bootstrap.sh installs it)")
REPO = "MiniMaxAI/MiniMax-M3"
REV = "b" * 40
PASSWORD = "guard-test-password-5d1e"


def guard_script(path):
    src = pathlib.Path(ROOT, "roles/weights_sync/templates/verified-only.sh.j2").read_text()
    path.write_text(jinja2.Template(src, keep_trailing_newline=True).render(ansible_managed="test"))
    path.chmod(0o755)
    return path


@pytest.fixture()
def served(tmp_path):
    root = tmp_path / "root"
    rev = root / REPO / REV
    (rev / "sub").mkdir(parents=True)
    (rev / "config.json").write_text("{}\n")
    (rev / "sub" / "shard.safetensors").write_bytes(os.urandom(4096))
    (root / REPO / (REV + ".manifest.sha256")).write_text("# manifest\n")
    (root / REPO / (REV + ".verified.json")).write_text("{}\n")
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    return {"root": root, "pw": pw, "tmp": tmp_path}


def pull(port, pw, paths, dest, *extra, stdin=None):
    urls = ["rsync://weights@127.0.0.1:%d/weights/%s" % (port, p) for p in paths]
    return subprocess.run(["rsync", "-a", "--password-file=%s" % pw, *extra, *urls, str(dest)],
                          input=stdin, capture_output=True, text=True, timeout=60)


def guarded(served):
    script = guard_script(served["tmp"] / "verified-only")
    # chroot as the role's daemon does (a file list is resolved inside the module then)
    return rsync_daemon(str(served["tmp"] / "d"), str(served["root"]), PASSWORD,
                        "use chroot = yes\npre-xfer exec = %s\n" % script)


def test_a_verified_revision_is_served_whole_by_manifest_and_by_file_list(served):
    with guarded(served) as port:
        full = pull(port, served["pw"], [REPO + "/" + REV + "/"], served["tmp"] / "full")
        assert full.returncode == 0, full.stderr
        assert (served["tmp"] / "full" / "sub" / "shard.safetensors").exists()
        man = pull(port, served["pw"], [REPO + "/" + REV + ".manifest.sha256"], served["tmp"] / "m")
        assert man.returncode == 0, man.stderr
        # the repair: --files-from on the revision directory (pull.yml)
        repair = pull(port, served["pw"], [REPO + "/" + REV + "/"], served["tmp"] / "r", "--files-from=-",
                      stdin="config.json\n")
        assert repair.returncode == 0, repair.stderr
        listing = subprocess.run(["rsync", "--list-only", "--password-file=%s" % served["pw"],
                                  "rsync://weights@127.0.0.1:%d/weights/%s/" % (port, REPO)],
                                 capture_output=True, text=True, timeout=60)
        assert listing.returncode == 0 and REV in listing.stdout, listing.stderr


def test_a_revision_whose_marker_went_is_refused_at_once(served):
    with guarded(served) as port:
        (served["root"] / REPO / (REV + ".verified.json")).unlink()  # a verification failed after render
        for path in (REPO + "/" + REV + "/", REPO + "/" + REV + ".manifest.sha256",
                     REPO + "/" + REV + "/sub/shard.safetensors"):
            out = pull(port, served["pw"], [path], served["tmp"] / "x")
            assert out.returncode == 10, (path, out)
            assert "%s/%s is not verified on this host" % (REPO, REV) in out.stderr
        assert not (served["tmp"] / "x").exists() or not any((served["tmp"] / "x").iterdir())


def test_one_unverified_path_among_several_refuses_the_transfer(served):
    other = "c" * 40
    (served["root"] / REPO / other).mkdir()
    with guarded(served) as port:
        out = pull(port, served["pw"], [REPO + "/" + REV + "/", REPO + "/" + other + "/"], served["tmp"] / "x")
        assert out.returncode == 10 and other in out.stderr


def test_the_marker_itself_is_no_revision(served):
    with guarded(served) as port:
        out = pull(port, served["pw"], [REPO + "/" + REV + ".verified.json"], served["tmp"] / "x")
        assert out.returncode == 10 and "not verified" in out.stderr


def test_without_the_check_the_daemon_serves_what_it_no_longer_verifies(served):
    """The control: the same daemon without `pre-xfer exec` serves the unverified revision, so the
    refusals above are the check's doing."""
    (served["root"] / REPO / (REV + ".verified.json")).unlink()
    with rsync_daemon(str(served["tmp"] / "d"), str(served["root"]), PASSWORD, "use chroot = yes\n") as port:
        out = pull(port, served["pw"], [REPO + "/" + REV + "/"], served["tmp"] / "x")
        assert out.returncode == 0 and (served["tmp"] / "x" / "config.json").exists()
