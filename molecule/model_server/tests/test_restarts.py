"""What systemd does with the model server on the node, without Ansible: a container killed behind
its back is started again, and a weight file changed since verification keeps the engine down
(the unit's ExecStartPre re-check), naming the file, until it is restored. Each test puts the
node back as it found it (serving, healthy). Runs last of the host-state tests
(molecule/model_server/verify.yml names the files in order): it restarts the engine.
"""
import re

testinfra_hosts = ["docker://mm3-model-server-node"]


def test_systemd_starts_a_killed_container_again(host, role, http_status, wait_for):
    name, unit = role["model_server_container_name"], role["model_server_service_name"] + ".service"
    before = host.check_output("docker inspect --format '{{.Id}}' %s", name)
    host.check_output("docker kill %s", name)

    def replaced():
        now = host.run("docker inspect --format '{{.Id}} {{.State.Running}}' %s", name).stdout.split()
        return now if len(now) == 2 and now[0] != before and now[1] == "true" else None
    assert wait_for(replaced, timeout=60), "no new container after 60 s"
    show = host.check_output("systemctl show --property=NRestarts --property=ActiveState %s", unit)
    assert "ActiveState=active" in show
    assert int(re.search(r"NRestarts=(\d+)", show).group(1)) >= 1, show
    assert wait_for(lambda: http_status("/health") == "200", timeout=60), "no health after the restart"


def test_a_weight_file_changed_since_verification_keeps_the_engine_down(host, role, node_vars, http_status, wait_for):
    """touch: the same bytes, a new mtime (what any write leaves behind)."""
    unit = role["model_server_service_name"] + ".service"
    weight = node_vars["lab_weights_dir"] + "/model.safetensors"
    mtime = host.check_output("stat -c %%.9Y %s", weight)
    try:
        host.check_output("touch -d '2026-01-01 00:00:00' %s", weight)
        touched = host.run("systemctl restart %s", unit)
        journal = host.check_output("journalctl -u %s -n 40 --no-pager -o cat", unit)
    finally:
        host.check_output("touch -d @%s %s", mtime, weight)
        host.run("systemctl reset-failed %s", unit)
        restored = host.run("systemctl restart %s", unit)
    assert touched.rc != 0
    assert "refusing to start" in journal, journal[-1500:]
    assert re.search(r"changed since verification. model\.safetensors", journal), journal[-1500:]
    assert restored.rc == 0, restored.stderr
    assert wait_for(lambda: http_status("/health") == "200", timeout=120), "no health on the restored file"
