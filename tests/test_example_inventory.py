"""The example inventory (inventories/example) a new site copies: every variable a stage needs
on a host is set for that host's group, so a first run gets past each role's input checks."""
import json
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "inventories" / "example" / "hosts.yml"


def hostvars(host):
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-inventory"), "-i", str(INVENTORY),
                           "--host", host], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(proc.stdout)


def test_nodes_get_the_rsync_password_the_weights_and_image_clients_need():
    """roles/weights_sync (client on the nodes) and image_carry refuse without it."""
    for host in ("gpu01.dc1.example.internal", "gpu02.dc1.example.internal", "stage01.dc1.example.internal"):
        assert hostvars(host).get("weights_sync_password") == "{{ vault_weights_sync_password }}", host


def test_vault_example_defines_what_the_inventory_references():
    text = (ROOT / "inventories" / "example" / "group_vars" / "all" / "vault.yml.example").read_text()
    assert "vault_weights_sync_password:" in text
