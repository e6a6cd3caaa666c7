"""Fixtures the host-state tests of molecule/model_server share (testinfra over `docker exec`
into the scenario's node; verify.yml runs them first, before its Ansible plays).

The scenario's choices have one home each: the node's inventory variables in molecule.yml
(weights directory, revision, port, API key) and the role's defaults in
roles/model_server/defaults/main.yml (unit, container and directory names), which the scenario
leaves as they are. The fixtures read both instead of repeating them.
"""
import json
import pathlib
import time

import pytest
import yaml

SCENARIO = pathlib.Path(__file__).resolve().parents[1]
PROJECT = SCENARIO.parents[1]
NODE = "docker://mm3-model-server-node"
# The stand-in engine image prepare.yml builds and loads on the node (tasks/pin-standin.yml).
STANDIN_IMAGE = "mm3-lab/standin-engine:latest"


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="session")
def node_vars():
    """The inventory variables molecule.yml gives the node (group `nodes`)."""
    return _load(SCENARIO / "molecule.yml")["provisioner"]["inventory"]["group_vars"]["nodes"]


@pytest.fixture(scope="session")
def role():
    """roles/model_server/defaults/main.yml (names and paths the scenario does not change)."""
    return _load(PROJECT / "roles" / "model_server" / "defaults" / "main.yml")


@pytest.fixture(scope="session")
def config_file(role):
    """The engine config holding the API key (roles/model_server/vars/main.yml names it so)."""
    return role["model_server_config_dir"] + "/engine.yaml"


@pytest.fixture(scope="module")
def image_id(host):
    """The ID of the stand-in image on the node: what the unit pins and the container runs."""
    return json.loads(host.check_output("docker image inspect %s", STANDIN_IMAGE))[0]["Id"]


@pytest.fixture(scope="module")
def container(host, role):
    """`docker inspect` of the engine container, as it is when the module starts."""
    return json.loads(host.check_output("docker inspect %s", role["model_server_container_name"]))[0]


@pytest.fixture(scope="module")
def unit_text(host, role):
    """The unit as systemd sees it (`systemctl cat`)."""
    return host.check_output("systemctl cat %s.service", role["model_server_service_name"])


# Asks the engine from the node itself; with the key, read on the node from the engine config,
# so that it never travels in a command line (the leak checks read `ps`).
_HTTP = r"""
import json, sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1])
if len(sys.argv) > 2:
    line = next(l for l in open(sys.argv[2]) if l.startswith("api-key:"))
    request.add_header("Authorization", "Bearer " + json.loads(line.split(":", 1)[1]))
try:
    print(urllib.request.urlopen(request, timeout=10).status)
except urllib.error.HTTPError as error:
    print(error.code)
except OSError as error:
    print("no answer: %s" % error)
"""


@pytest.fixture(scope="module")
def http_status(host, node_vars, config_file):
    """status(path, key=False): the HTTP status the engine answers on 127.0.0.1:<serving_port>."""
    def status(path, key=False):
        url = "http://127.0.0.1:%d%s" % (node_vars["serving_port"], path)
        argv = ["python3", "-c", _HTTP, url] + ([config_file] if key else [])
        return host.check_output(" ".join(["%s"] * len(argv)), *argv)
    return status


@pytest.fixture(scope="module")
def wait_for():
    """wait_for(probe, timeout): probe() until it returns a true value; returns the last value."""
    def wait(probe, timeout=120, delay=2):
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value or time.monotonic() > deadline:
                return value
            time.sleep(delay)
    return wait
