"""Every custom module's documentation renders with ansible-doc (what operators read)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "library").glob("*.py"))


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_renders(name):
    doc = Path(sys.executable).with_name("ansible-doc")
    proc = subprocess.run([str(doc), "-M", str(ROOT / "library"), name], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 0, proc.stderr
    assert f"MODULE {name}" in proc.stdout and "OPTIONS" in proc.stdout and "RETURN VALUES" in proc.stdout, proc.stdout[:500]
