# -*- coding: utf-8 -*-
"""Filters of the `model_server` role: turn `serving_spec` into the container's argv and
into the text forms the role installs (a shell command for review, a systemd ExecStart).

Pure functions; tests/unit/test_model_server_filters.py calls them directly and the golden
tests (tests/test_plan_golden.py) compare what playbooks/plan.yml renders with them.
"""
from __future__ import annotations

import ipaddress
import re
import shlex

from ansible.errors import AnsibleFilterError

_SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def checked(argv):
    """argv as strings, refused (AnsibleFilterError) when a token holds a control character:
    the last guard where argv is built (serving_resolve already refuses such input by name)."""
    argv = [str(token) for token in argv]
    bad = [token for token in argv if _CONTROL.search(token)]
    if bad:
        raise AnsibleFilterError("refusing to build a command with a control character in %r: fix "
                                 "the value it came from (serving_* or model_server_* variables)."
                                 % bad[0])
    return argv


def publish(address, port, container_port):
    """docker -p HOST:PORT:CPORT, with an IPv6 host address in brackets ([::1]:30000:8000)."""
    try:
        if ipaddress.ip_address(str(address)).version == 6:
            address = "[%s]" % address
    except ValueError:
        pass
    return "%s:%s:%s" % (address, port, container_port)


def invocation(spec, command):
    """What follows `docker run [options]` to run `command` in the spec's image: the image and
    the command, or, for an image with an ENTRYPOINT (vllm/vllm-openai: `vllm serve`), the
    entrypoint replaced: --entrypoint CMD0 IMAGE CMD1..., so the image's own never prefixes it."""
    command = [str(token) for token in command]
    image = spec["image"]["ref"]
    if spec.get("entrypoint"):
        return ["--entrypoint", command[0], image] + command[1:]
    return [image] + command


def server_invocation(spec):
    """The image and the server command: only the arguments when the command starts with the
    image's ENTRYPOINT (the image's own convention, like the article's Kubernetes `args:`)."""
    entrypoint = [str(token) for token in spec.get("entrypoint") or []]
    command = [str(token) for token in spec.get("command") or []]
    if entrypoint and command[:len(entrypoint)] == entrypoint:
        return [spec["image"]["ref"]] + command[len(entrypoint):]
    return invocation(spec, command)


def jit_cache_args(spec, host_dir):
    """-v HOST:CONTAINER (read-write) and the -e variables that point the kernels' JIT caches
    into it; empty without a host directory or without spec.jit_cache (entries without MSA)."""
    cache = spec.get("jit_cache") or {}
    if not host_dir or not cache.get("container_dir"):
        return []
    argv = ["-v", "%s:%s" % (host_dir, cache["container_dir"])]
    for key in sorted(cache.get("env") or {}):
        argv += ["-e", "%s=%s" % (key, cache["env"][key])]
    return argv


def hardening_args(container):
    """The least-privilege options of serving_spec.container, in a fixed order:
    --security-opt no-new-privileges, --cap-drop X.., --cap-add X.., --pids-limit N,
    --read-only, --tmpfs PATH[:opts].., --user UID[:GID]. Empty for an empty dict."""
    container = container or {}
    args = []
    if container.get("no_new_privileges"):
        args += ["--security-opt", "no-new-privileges"]
    for cap in container.get("cap_drop") or []:
        args += ["--cap-drop", str(cap)]
    for cap in container.get("cap_add") or []:
        args += ["--cap-add", str(cap)]
    if container.get("pids_limit") is not None:
        args += ["--pids-limit", str(container["pids_limit"])]
    if container.get("read_only"):
        args += ["--read-only"]
    for mount in container.get("tmpfs") or []:
        args += ["--tmpfs", str(mount)]
    if container.get("user") is not None:
        args += ["--user", str(container["user"])]
    return args


def _env_args(spec):
    """-e HF_HUB_OFFLINE=1, then the entry's and the container's environment, sorted."""
    env = dict(spec.get("env") or {})
    env.update((spec.get("container") or {}).get("env") or {})
    argv = ["-e", "HF_HUB_OFFLINE=1"]
    for key in sorted(env):
        argv += ["-e", "%s=%s" % (key, env[key])]
    return argv


def docker_run_argv(spec, name="minimax-m3", shm_size="32g", config_host_path=None,
                    config_container_path=None, docker_bin="docker", jit_cache_dir=None):
    """The `docker run` argv for a resolved serving_spec, in the seed's order, with the
    container's least-privilege options (hardening_args) after --ipc=host:

    docker run --rm --name N <device args> --shm-size 32g --ipc=host <hardening> -p B:P:CP
      -e HF_HUB_OFFLINE=1 [-e K=V ...] -v WEIGHTS:/models/X:ro [-v CONFIG:CCONFIG:ro]
      [-v JITCACHE:CDIR -e CACHE_VARS...] IMAGE <engine command or, under an ENTRYPOINT, its
      arguments> [--config CCONFIG]

    The config file (holding the API key) is mounted and passed only when spec.auth is true,
    so the key never appears in argv, the unit or `docker inspect`.
    """
    argv = [docker_bin, "run", "--rm", "--name", name]
    argv += [str(a) for a in spec.get("device_args") or []]
    argv += ["--shm-size", str(shm_size), "--ipc=host"]
    argv += hardening_args(spec.get("container"))
    argv += ["-p", publish(spec["bind_address"], spec["port"], spec["container_port"])]
    argv += _env_args(spec)
    weights = spec["weights"]
    argv += ["-v", "%s:%s:ro" % (weights["dir"], weights["container_dir"])]
    with_config = bool(spec.get("auth")) and config_host_path and config_container_path
    if with_config:
        argv += ["-v", "%s:%s:ro" % (config_host_path, config_container_path)]
    argv += jit_cache_args(spec, jit_cache_dir)
    argv += server_invocation(spec)
    if with_config:
        argv += ["--config", config_container_path]
    return checked(argv)


def msa_gate_argv(spec, gate_command, name="minimax-m3", docker_bin="docker", jit_cache_dir=None):
    """One-shot, single-process container for the MSA JIT warm-up gate: same image, devices,
    environment, least privilege and JIT cache directory as the server, no port, no weights;
    exits non-zero when MSA is not available (model_server runs it once per image digest)."""
    argv = [docker_bin, "run", "--rm", "--name", name + "-msa-gate"]
    argv += [str(a) for a in spec.get("device_args") or []]
    argv += ["--ipc=host"] + hardening_args(spec.get("container")) + _env_args(spec)
    argv += jit_cache_args(spec, jit_cache_dir)
    argv += invocation(spec, gate_command)
    return checked(argv)


def _lines(tokens, breaks=()):
    """Group tokens the seed's way: `docker run --rm --name N` on the first line, then a new
    line before every option and before the first occurrence of each token in `breaks`
    (the image reference, the engine command)."""
    pending = [str(b) for b in breaks or []]
    lines = [[]]
    for index, token in enumerate(tokens):
        starts = index > 4 and token.startswith("-")
        if token in pending:
            pending.remove(token)
            starts = True
        if lines[-1] and starts:
            lines.append([])
        lines[-1].append(token)
    return lines


def shell_join(argv, breaks=()):
    """A shell command, one option per line with `\\` continuations (the seed's layout)."""
    lines = _lines([str(t) for t in argv], breaks)
    return " \\\n  ".join(" ".join(shlex.quote(t) for t in line) for line in lines) + "\n"


def systemd_quote(token):
    """Quote one argument for a systemd Exec line: % and $ doubled, quoted when needed."""
    token = str(token).replace("%", "%%").replace("$", "$$")
    if _SYSTEMD_PLAIN.match(token):
        return token
    return '"' + token.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_join(argv, breaks=()):
    """An Exec line value, one option per line with `\\` continuations."""
    lines = _lines([str(t) for t in argv], breaks)
    return " \\\n    ".join(" ".join(systemd_quote(t) for t in line) for line in lines)


def command_tokens(text):
    """Split a rendered shell command back into argv (line continuations removed)."""
    return shlex.split(text.replace("\\\n", " "))


class FilterModule(object):
    """model_server_docker_argv, model_server_msa_gate_argv, model_server_invocation,
    model_server_shell_join, model_server_systemd_join."""

    def filters(self):
        return {
            "model_server_docker_argv": docker_run_argv,
            "model_server_invocation": invocation,
            "model_server_msa_gate_argv": msa_gate_argv,
            "model_server_shell_join": shell_join,
            "model_server_systemd_join": systemd_join,
        }
