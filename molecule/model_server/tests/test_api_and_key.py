"""The model server's API as the node serves it: bound on loopback only, health without a key,
everything else only with it; and the key in none of the places an operator or another local
user reads (the unit, the process list, docker inspect, the journal, the launch command).
testinfra over `docker exec`, run first by molecule/model_server/verify.yml.
"""
import pytest

testinfra_hosts = ["docker://mm3-model-server-node"]


def test_the_api_port_is_bound_on_loopback_only(host, node_vars):
    port = node_vars["serving_port"]
    listening = [s for s in host.socket.get_listening_sockets() if s.startswith("tcp://") and s.endswith(":%d" % port)]
    assert listening == ["tcp://127.0.0.1:%d" % port]


def test_health_answers_without_a_key(http_status):
    assert http_status("/health") == "200"


def test_the_api_refuses_a_request_without_the_key(http_status):
    assert http_status("/v1/models") == "401"


def test_the_api_answers_with_the_key(http_status):
    assert http_status("/v1/models", key=True) == "200"


@pytest.mark.parametrize("probe", [
    "systemctl cat {model_server_service_name}.service",
    "ps -eo args",
    "docker inspect {model_server_container_name}",
    "journalctl --unit {model_server_service_name}.service --no-pager",
    "cat {model_server_config_dir}/docker-run.cmd",
])
def test_the_key_is_in_none_of_them(host, node_vars, role, probe):
    command = probe.format(**role)
    leaked = node_vars["serving_api_key"] in host.check_output(command)
    assert not leaked, "the API key leaked into `%s`" % command  # no `in` here: pytest would print the key
