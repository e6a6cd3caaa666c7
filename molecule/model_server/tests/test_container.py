"""Host state of the engine container on the model server node: what Docker runs (`docker
inspect`), the least privilege it applied (and the kernel's view of the process in /proc), the
bounded logs, and the stand-in image's ENTRYPOINT. testinfra over `docker exec`, run first by
molecule/model_server/verify.yml.
"""
import re

import pytest

testinfra_hosts = ["docker://mm3-model-server-node"]


def mount_rw(container, destination):
    """[RW] of the container's mounts at `destination` (one mount: one entry)."""
    return [m["RW"] for m in container["Mounts"] if m["Destination"] == destination]


def test_the_container_runs(container):
    assert container["State"]["Running"]


def test_the_container_runs_the_pinned_image(container, image_id):
    assert container["Image"] == image_id


def test_the_container_shares_the_hosts_ipc_with_32g_shm(container):
    assert container["HostConfig"]["IpcMode"] == "host"
    assert container["HostConfig"]["ShmSize"] == 32 * 1024 ** 3


def test_the_container_is_offline(container):
    assert "HF_HUB_OFFLINE=1" in container["Config"]["Env"]


def test_the_images_entrypoint_gets_only_arguments(container):
    """The image's own ENTRYPOINT (vllm serve, like vllm/vllm-openai) is kept; after it only the
    model and the flags, never a second `serve`."""
    assert container["Config"]["Entrypoint"] == ["vllm", "serve"]
    assert container["Config"]["Cmd"][0] == "/models/tiny-m3"
    assert "serve" not in container["Config"]["Cmd"]


@pytest.mark.parametrize("destination,rw", [
    ("/var/cache/minimax-m3-jit", True),  # the JIT cache the gate warmed
    ("/models/tiny-m3", False),  # the weights
    ("/etc/model-server/engine.yaml", False),  # the key file
])
def test_each_mount_is_writable_only_where_the_engine_writes(container, destination, rw):
    assert mount_rw(container, destination) == [rw]


def test_no_new_privileges(container):
    assert "no-new-privileges" in container["HostConfig"]["SecurityOpt"]


def test_no_unconfined_profile(container):
    assert not [o for o in container["HostConfig"]["SecurityOpt"] if "unconfined" in o]


def test_every_capability_is_dropped_and_none_added(container):
    assert container["HostConfig"]["CapDrop"] == ["ALL"]
    assert container["HostConfig"]["CapAdd"] in (None, [])


def test_the_process_count_is_bounded(container):
    assert container["HostConfig"]["PidsLimit"] == 1024


def test_the_root_filesystem_is_read_only_with_a_tmpfs(container):
    assert container["HostConfig"]["ReadonlyRootfs"] is True
    assert container["HostConfig"]["Tmpfs"] == {"/tmp": "rw,nosuid,nodev,size=1g,mode=1777"}


def test_the_engine_runs_as_nobody(container):
    assert container["Config"]["User"] == "65534:65534"


def test_docker_bounds_the_containers_log(container):
    """docker_engine's daemon.json as prepare.yml sets it: json-file, 2 x 1 MB."""
    assert container["HostConfig"]["LogConfig"]["Type"] == "json-file"
    assert container["HostConfig"]["LogConfig"]["Config"] == {"max-file": "2", "max-size": "1m"}


# Read from the node's /proc (the kernel's view of the engine process), not through `docker
# exec`: runc cannot exec as a non-root user inside this nested lab host.
@pytest.fixture(scope="module")
def process(host, container):
    pid = container["State"]["Pid"]
    mountinfo = host.file("/proc/%d/mountinfo" % pid).content_string.splitlines()
    return {"status": host.file("/proc/%d/status" % pid).content_string,
            "mounts": [(line.split()[4], line.split()[5]) for line in mountinfo]}


@pytest.mark.parametrize("pattern", [
    r"^Uid:\s+65534\s+65534\s+65534\s+65534$",  # real, effective, saved, filesystem: nobody
    r"^CapEff:\s+0000000000000000$",
    r"^CapBnd:\s+0000000000000000$",
    r"^NoNewPrivs:\s+1$",
])
def test_the_kernel_sees_no_privilege(process, pattern):
    assert re.search(pattern, process["status"], re.M), process["status"]


def test_the_kernel_sees_a_read_only_root(process):
    assert [o for point, o in process["mounts"] if point == "/" and o.startswith("ro,")], process["mounts"]


def test_the_kernel_sees_a_nosuid_nodev_tmp(process):
    assert [o for point, o in process["mounts"] if point == "/tmp" and o.startswith("rw,nosuid,nodev")], \
        process["mounts"]


def test_docker_rotates_a_flooding_containers_log(host):
    """5 MB written by a container against 2 x 1 MB: at most 2 files of about 1 MB each remain."""
    name = "verify-log-flood"
    flood = host.run("docker run --name %s --entrypoint python3 mm3-lab/standin-engine:latest -c %s", name,
                     "import sys; [sys.stdout.write('x' * 999 + '\\n') for _ in range(5000)]")
    try:
        assert flood.rc == 0, flood.stderr
        log = host.check_output("docker inspect --format '{{.LogPath}}' %s", name)
        sizes = [int(size) for size in host.check_output("stat -c %%s %s*", log).split()]
    finally:
        host.run("docker rm --force %s", name)
    assert 1 <= len(sizes) <= 2, sizes
    assert max(sizes) <= 1100000, sizes
    assert 1000000 < sum(sizes) < 2300000, sizes  # the flood reached the log, and was cut


def test_the_standin_fails_like_the_real_image_on_vllm_serve_after_its_entrypoint(host, node_vars):
    """`docker run IMAGE vllm serve ...` (the old plan) against an ENTRYPOINT of vllm serve:
    the stand-in fails the way the real vllm/vllm-openai image does."""
    run = host.run("docker run --rm -e HF_HUB_OFFLINE=1 -v %s:/models/tiny-m3:ro mm3-lab/standin-engine:latest "
                   "vllm serve --model /models/tiny-m3", node_vars["lab_weights_dir"])
    assert run.rc == 2
    assert "unrecognized arguments: serve" in run.stderr
