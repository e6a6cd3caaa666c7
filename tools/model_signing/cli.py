"""The upstream OpenSSF model-signing CLI for the interoperability tests and the bench: a venv in
.cache/model-signing-venv installed from requirements.lock beside this file with --require-hashes
(wheels only), reused while the lock and the Python are unchanged. Never installed on a host.
Callers in parallel (CI's test and lab lanes) take turns on <venv>.lock: the first installs, the
others wait and find it installed (two at once cleared the venv under each other's pip)."""
import fcntl
import hashlib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LOCK = os.path.join(HERE, "requirements.lock")


def stamp_path(venv):
    """The file that marks `venv` installed from this lock by this Python."""
    with open(LOCK, "rb") as handle:
        tag = hashlib.sha256(handle.read() + sys.version.encode()).hexdigest()[:12]
    return os.path.join(venv, ".lock-" + tag)


def model_signing_cli(venv=os.path.join(ROOT, ".cache", "model-signing-venv")):
    """The path of the `model_signing` executable, installing it first when needed."""
    stamp = stamp_path(venv)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        if not os.path.exists(stamp):
            subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
            subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check",
                            "--require-hashes", "--only-binary=:all:", "-r", LOCK], check=True)
            open(stamp, "w").close()
    return os.path.join(venv, "bin", "model_signing")
