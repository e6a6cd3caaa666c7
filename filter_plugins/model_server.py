# -*- coding: utf-8 -*-
"""Filters of the `model_server` role: turn `serving_spec` into the container's argv and
into the text forms the role installs (a shell command for review, a systemd ExecStart).

Pure functions; tests/unit/test_model_server_filters.py calls them directly and the golden
tests (tests/test_plan_golden.py) compare what playbooks/plan.yml renders with them.
"""
from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import re
import shlex

import yaml

from ansible.errors import AnsibleFilterError
from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr
from ansible_collections.mm3.shared.plugins.module_utils import engine_args as ea
from ansible_collections.mm3.shared.plugins.module_utils import validation as v

_SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def checked(argv):
    """argv as strings, refused (AnsibleFilterError) when a token holds a control character:
    the last guard where argv is built (serving_resolve already refuses such input by name)."""
    argv = [str(token) for token in argv]
    bad = [token for token in argv if v.has_control(token)]
    if bad:
        raise AnsibleFilterError("refusing to build a command with a control character in %r: fix "
                                 "the value it came from (serving_* or model_server_* variables)."
                                 % bad[0])
    return argv


def publish(address, port, container_port):
    """docker -p HOST:PORT:CPORT, with an IPv6 host address in brackets ([::1]:30000:8000)."""
    if getattr(v.ip_address(str(address)), "version", 4) == 6:
        address = "[%s]" % address
    return "%s:%s:%s" % (address, port, container_port)


def invocation(spec, command):
    """What follows `docker run [options]` to run `command` in the spec's image: the image and
    the command, or, for an image with an ENTRYPOINT (vllm/vllm-openai: `vllm serve`), the
    entrypoint replaced: --entrypoint CMD0 IMAGE CMD1..., so the image's own never prefixes it
    (docker_run.invocation, which the node's release check reads the unit back with)."""
    return dr.invocation(spec["image"]["ref"], command, bool(spec.get("entrypoint")))


def server_invocation(spec):
    """The image and the server command: only the arguments when the command starts with the
    image's ENTRYPOINT (the image's own convention, like the article's Kubernetes `args:`)."""
    return dr.server_invocation(spec["image"]["ref"], spec.get("command") or [], spec.get("entrypoint"))


def jit_cache_args(spec, host_dir):
    """-v HOST:CONTAINER (read-write) and the -e variables that point the engine's kernel caches
    into it (spec.jit_cache, every profile: serving_engines.<engine>.jit_cache); empty without a
    host directory (model_server passes the image's: <model_server_jit_cache_root>/<digest hex>)."""
    cache = spec.get("jit_cache") or {}
    if not host_dir or not cache.get("container_dir"):
        return []
    argv = ["-v", "%s:%s" % (host_dir, cache["container_dir"])]
    for key, value in jit_cache_env(spec):
        argv += ["-e", "%s=%s" % (key, value)]
    return argv


def jit_cache_env(spec):
    """[(name, value)] of the variables that point the kernels' JIT caches into the cache
    directory, sorted (the unit's -e and the pod's env)."""
    env = (spec.get("jit_cache") or {}).get("env") or {}
    return [(key, str(env[key])) for key in sorted(env)]


def flag_value(tokens, flag):
    """What argparse ends with for `flag` in `tokens`: the last occurrence wins, `--flag value`
    and `--flag=value` alike; True for an occurrence without a value; None when absent. On a
    resolved serving_spec.command that is the engine's reading: serving_resolve has refused
    abbreviations and repeated flags (engine_args, over the engine's recorded argument list)."""
    found = None
    for index, token in enumerate(tokens):
        if token == flag:
            following = tokens[index + 1] if index + 1 < len(tokens) else None
            found = following if following is not None and not following.startswith("-") else True
        elif token.startswith(flag + "="):
            found = token[len(flag) + 1:]
    return found


def _slug(text):
    """A file-name-safe lower-case form (GPU model names in marker files)."""
    return re.sub(r"[^a-z0-9._]+", "-", str(text).lower()).strip("-") or "none"


def precompile_steps(spec):
    """The precompile steps (spec.jit_cache.precompile, serving_engines.<engine>.jit_cache) that
    apply to this profile, sorted by name: those whose `when` flag has that value in the resolved
    server command (flag_value: as argparse reads it). Each: {name, command: the step's command
    followed by the server's arguments (the command's head `replaces` dropped), timeout_flag,
    gpu, marker: the file in the image's cache that records it ran, named by step, GPU model and
    a hash of the arguments (a new GPU model or argument list runs it again; a restart does not)}.
    Refused (AnsibleFilterError) when the server command does not start with `replaces`."""
    spec = spec or {}
    command = [str(token) for token in spec.get("command") or []]
    gpu = _slug((spec.get("gpu") or {}).get("model"))
    steps = []
    precompile = (spec.get("jit_cache") or {}).get("precompile") or {}
    for name in sorted(precompile):
        step = precompile[name] or {}
        when = [str(token) for token in step.get("when") or []]
        if when:
            got = flag_value(command, when[0])
            if got != (when[1] if len(when) > 1 else True):
                continue
        head = [str(token) for token in step.get("replaces") or []]
        if command[:len(head)] != head:
            raise AnsibleFilterError("precompile step %s replaces %r, but the server command starts with %r: fix "
                                     "serving_engines.%s.jit_cache.precompile.%s.replaces."
                                     % (name, head, command[:len(head)], spec.get("engine"), name))
        arguments = command[len(head):]
        key = hashlib.sha256(json.dumps([name, gpu, arguments]).encode()).hexdigest()[:12]
        steps.append({"name": str(name), "command": [str(t) for t in step.get("command") or []] + arguments,
                      "timeout_flag": step.get("timeout_flag"), "gpu": gpu,
                      "marker": ".precompile-%s-%s-%s.json" % (_slug(name), gpu, key)})
    return steps


def precompile_argv(spec, step, timeout, name="minimax-m3", shm_size="32g", docker_bin="docker",
                    jit_cache_dir=None):
    """One-shot container for a precompile step (precompile_steps): the server's image, devices,
    shared memory, least privilege, environment, read-only weights and kernel cache; no port, no
    API key; its command, then `timeout_flag timeout` when the tool takes one. Refused without a
    cache directory: what it compiles would be lost with the container."""
    if not jit_cache_dir or not (spec.get("jit_cache") or {}).get("container_dir"):
        raise AnsibleFilterError("precompile step %s needs the image's kernel cache directory (jit_cache_dir): "
                                 "without it the kernels it compiles go with the container." % step.get("name"))
    argv = [docker_bin, "run", "--rm", "--name", "%s-precompile-%s" % (name, _slug(step["name"]))]
    argv += [str(a) for a in spec.get("device_args") or []]
    argv += ["--shm-size", str(shm_size), "--ipc=host"]
    argv += hardening_args(spec.get("container")) + _env_args(spec)
    weights = spec["weights"]
    argv += ["-v", "%s:%s:ro" % (weights["dir"], weights["container_dir"])]
    argv += jit_cache_args(spec, jit_cache_dir)
    command = list(step["command"])
    if step.get("timeout_flag"):
        command += [str(step["timeout_flag"]), str(int(timeout))]
    argv += invocation(spec, command)
    return checked(argv)


def hardening_args(container):
    """The least-privilege options of serving_spec.container (docker_run.hardening_args, the one
    home a release's container part reads too)."""
    return dr.hardening_args(container)


def _env_args(spec):
    """-e NAME=VALUE for each of engine_env."""
    argv = []
    for key, value in ea.engine_env(spec):
        argv += ["-e", "%s=%s" % (key, value)]
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
    argv += engine_container_args(spec, config_container_path if with_config else None)
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


# --- Kubernetes: the same engine command as a Deployment (role model_server_k8s) -------------
#
# What runs in the pod is what the unit runs: the same image, the same command (the image's
# ENTRYPOINT kept or replaced exactly as `docker run` does), the same environment, the same
# least-privilege options where Kubernetes has them. tests/test_k8s_manifests.py proves the
# engine arguments of every profile's Deployment equal the ones of its systemd unit.

K8S_APP = "minimax-m3"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[1-9][0-9]{0,6}(Ki|Mi|Gi|Ti)$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_RSYNC_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
K8S_ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
K8S_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# The device plugins' resource names (NVIDIA's GPU Operator, AMD's GPU Operator); the CPU lab
# row asks for none.
K8S_GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "cpu": None}
# What the pre-fill Job runs (sh, every value from its environment, never spliced into the text):
# pull the manifest, refuse it unless it hashes to the pin (nothing moved yet), pull the revision
# beside it, check every file against it and that no other file is there, and only then write
# the marker the engine pod's init container checks. The same order as roles/weights_sync, and
# the same owner and modes (root, 0755/0644, also set on a volume verified before): the engine
# (no capability) reads the weights through the mode bits alone. The marker is the pinned
# manifest hash, then the size, mtime, inode and name of every file as they were when their
# bytes were checked (K8S_LISTING), so a file changed, replaced, added or removed since is seen.
K8S_LISTING = "listing() { find . -type f -exec stat -c '%s %Y %i %n' {} + | LC_ALL=C sort; }"
K8S_PREFILL_SCRIPT = r"""set -eu
LISTING
w=${MM3_WEIGHTS_DIR:-/weights}
rev=$MM3_REVISION
dir=$w/$rev
man=$w/$rev.manifest.sha256
marker=$w/$rev.verified
url=rsync://$MM3_RSYNC_USER@$MM3_RSYNC_SERVER:$MM3_RSYNC_PORT/weights/$MM3_REPO
pw=${MM3_PASSWORD_FILE:-/etc/weights_sync/rsync.password}
if [ -f "$marker" ] && [ "$(head -n 1 "$marker")" = "$MM3_MANIFEST_SHA256" ] && [ -f "$man" ] \
   && [ "$(sha256sum "$man" | cut -d' ' -f1)" = "$MM3_MANIFEST_SHA256" ] && [ -d "$dir" ] \
   && [ "$(tail -n +2 "$marker")" = "$(cd "$dir" && listing)" ]; then
  chown -R 0:0 "$dir"
  chmod -R u=rwX,go=rX "$dir"
  echo "prefill: $MM3_REPO@$rev is already verified in this volume"
  exit 0
fi
rm -f "$marker"
rsync --checksum --times --timeout=60 --password-file="$pw" \
  "$url/$rev.manifest.sha256" "$w/.incoming.manifest"
got=$(sha256sum "$w/.incoming.manifest" | cut -d' ' -f1)
if [ "$got" != "$MM3_MANIFEST_SHA256" ]; then
  rm -f "$w/.incoming.manifest"
  echo "prefill: staging serves a manifest for $MM3_REPO@$rev hashing to $got, \
not to the pinned $MM3_MANIFEST_SHA256: nothing was synced; compare the manifest \
on staging with serving_weights_manifest_sha256" >&2
  exit 2
fi
mv "$w/.incoming.manifest" "$man"
mkdir -p "$dir"
rsync --archive --chown=0:0 --chmod=D0755,F0644 --delete-delay --partial-dir=.rsync-partial \
  --delay-updates --timeout=600 --bwlimit="${MM3_BWLIMIT:-0}" --password-file="$pw" "$url/$rev/" "$dir/"
cd "$dir"
if ! sha256sum --check --quiet "$man"; then
  echo "prefill: $MM3_REPO@$rev does not match its pinned manifest (the lines above): \
no marker written; the Job retries the sync" >&2
  exit 3
fi
grep -v '^#' "$man" | cut -c67- | sort > "$w/.listed"
find . -type f | sed 's|^\./||' | sort > "$w/.present"
extra=$(comm -13 "$w/.listed" "$w/.present")
rm -f "$w/.listed" "$w/.present"
if [ -n "$extra" ]; then
  echo "prefill: files not in the manifest of $MM3_REPO@$rev: $extra; no marker written" >&2
  exit 3
fi
{ printf '%s\n' "$MM3_MANIFEST_SHA256"; listing; } > "$marker.tmp"
mv "$marker.tmp" "$marker"
echo "prefill: $MM3_REPO@$rev verified against manifest $MM3_MANIFEST_SHA256"
""".replace("LISTING", K8S_LISTING)
# The engine pod's first init container: serve only a revision the pre-fill verified, whose
# files are still as they were when their bytes were checked (no temporary file: the root
# filesystem is read-only).
K8S_MARKER_SCRIPT = r"""LISTING
m=/weights/$MM3_REVISION.verified
if [ "$(head -n 1 "$m" 2>/dev/null)" != "$MM3_MANIFEST_SHA256" ]; then
  echo "weights $MM3_REVISION are not verified in this volume ($m does not hold \
the pinned manifest hash $MM3_MANIFEST_SHA256): run the pre-fill Job (playbooks/k8s.yml) first" >&2
  exit 1
fi
expected=$(tail -n +2 "$m")
now=$(cd "/weights/$MM3_REVISION" && listing)
if [ -z "$expected" ] || [ "$now" != "$expected" ]; then
  changed=$( { printf '%s\n' "$expected"; echo --; printf '%s\n' "$now"; } \
    | awk '$0 == "--" { s = 1; next }
      !s { e[$0] = 1; next }
      !($0 in e) { sub(/^[0-9]+ [0-9]+ [0-9]+ [.][/]/, ""); print }' \
    | head -n 5 | tr '\n' ' ')
  echo "weights $MM3_REVISION changed in this volume since the pre-fill verified them \
(size, mtime or inode of: ${changed:-a file that is gone}): run the pre-fill Job again" >&2
  exit 1
fi
""".replace("LISTING", K8S_LISTING)


K8S_SECCOMP = {"type": "RuntimeDefault"}


def k8s_exec(spec, invocation_argv):
    """(image, command, args) of the container that runs what `docker run ... <invocation>`
    runs: `--entrypoint X IMAGE A..` -> command [X], args [A..] (the ENTRYPOINT replaced);
    `IMAGE A..` -> no command, args [A..] (the image's ENTRYPOINT kept, CMD replaced)."""
    argv = [str(token) for token in invocation_argv]
    if argv[:1] == ["--entrypoint"]:
        return argv[2], [argv[1]], argv[3:]
    return argv[0], None, argv[1:]


def engine_container_args(spec, config_container_path=None):
    """What follows the image in the unit's `docker run` (server_invocation, then --config when
    the engine reads its API key from the mounted config file)."""
    tokens = server_invocation(spec)
    if spec.get("auth") and config_container_path:
        tokens = tokens + ["--config", config_container_path]
    return tokens


def _k8s_quantity_gi(size_gb, margin):
    """Gi holding size_gb (10^9 bytes) plus a fractional margin, rounded up."""
    return "%dGi" % -(-int(float(size_gb) * (1 + margin) * 1e9) // (1 << 30))


def _k8s_str(value, where, problems, pattern=None, what=None, optional=False):
    if value is None or value == "":
        if not optional:
            problems.append("%s is empty: set it (%s)." % (where, what or "a value"))
        return
    if not isinstance(value, str):
        problems.append("%s is a %s, not a string: set %s." % (where, v.type_name(value), what or "a string"))
        return
    if v.has_control(value):
        problems.append("%s holds a control character: write it on one line without one." % where)
        return
    # a pattern, or a check of the shared validation module
    if pattern is not None and not (pattern(value) if callable(pattern) else pattern.match(value)):
        problems.append("%s is %r: set %s." % (where, value, what))


def _k8s_int(value, where, low, high, problems):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        problems.append("%s is %r: set an integer from %d to %d." % (where, value, low, high))


def _k8s_string_map(value, where, problems):
    if not isinstance(value, dict):
        problems.append("%s is a %s: set a mapping of label keys to values." % (where, v.type_name(value)))
        return
    for key, item in value.items():
        _k8s_str(key, "%s key" % where, problems, _LABEL_KEY, "a label key (example.com/name)")
        _k8s_str(item, "%s[%s]" % (where, key), problems, _LABEL_VALUE,
                 "a label value (63 characters of [A-Za-z0-9_.-])", optional=item == "")


def k8s_problems(spec, settings):
    """Every reason the Kubernetes objects of `spec` cannot be rendered or applied as `settings`
    ask (the central check of model_server_k8s_*: names, ranges, quantities, the pinned image,
    the weights pin and the staging source, then the rendered objects' sizes against what an API
    server admits), each naming the fix; empty when they can."""
    return _k8s_checked(spec, settings)[0]


def _k8s_checked(spec, settings):
    """(problems, objects): the objects are rendered once the inputs pass, and refused (None) when
    the API server would refuse one of them (k8s_size_problems)."""
    problems = _k8s_input_problems(spec, settings)
    if problems:
        return problems, None
    objects = _k8s_objects(spec, settings)
    problems = k8s_size_problems(objects)
    return problems, None if problems else objects


def _k8s_input_problems(spec, settings):
    """k8s_problems of the inputs alone, before anything is rendered."""
    p = []
    s = settings or {}
    dns = "a DNS-1123 label (lower-case letters, digits and '-', at most 63)"
    _k8s_str(s.get("name"), "model_server_k8s_name", p, _DNS_LABEL, dns)
    if isinstance(s.get("name"), str) and len(s["name"]) > 40:
        p.append("model_server_k8s_name %r is longer than 40 characters: the Job and volume names "
                 "add a revision to it; shorten it." % s["name"])
    _k8s_str(s.get("namespace"), "model_server_k8s_namespace", p, _DNS_LABEL, dns)
    _k8s_str(s.get("gateway_namespace"), "model_server_k8s_gateway_namespace", p, _DNS_LABEL,
             dns + ": the namespace of the gateway, the only one the NetworkPolicy admits")
    _k8s_int(s.get("replicas"), "model_server_k8s_replicas", 1, 64, p)
    _k8s_int(s.get("probe_period_s"), "model_server_k8s_probe_period_s", 1, 300, p)
    _k8s_int(s.get("startup_timeout_s"), "model_server_k8s_startup_timeout_s", 60, 86400, p)
    _k8s_int(s.get("stop_timeout_s"), "model_server_k8s_stop_timeout_s", 1, 3600, p)
    _k8s_int(s.get("prefill_timeout_s"), "model_server_k8s_prefill_timeout_s", 60, 604800, p)
    _k8s_int(s.get("prefill_bwlimit"), "model_server_k8s_prefill_bwlimit", 0, 10 ** 9, p)
    for key in ("shm_size", "jit_cache_size"):
        _k8s_str(s.get(key), "model_server_k8s_" + key, p, _QUANTITY, "a quantity such as 32Gi")
    _k8s_str(s.get("weights_size"), "model_server_k8s_weights_size", p, _QUANTITY,
             "a quantity such as 500Gi, or leave it empty (the matrix size + 10 %)", optional=True)
    _k8s_str(s.get("weights_storage_class"), "model_server_k8s_weights_storage_class", p,
             _DNS_SUBDOMAIN, "a StorageClass name, or leave it empty (the cluster's default)", optional=True)
    modes = s.get("weights_access_modes")
    if not isinstance(modes, list) or not modes or any(m not in K8S_ACCESS_MODES for m in modes):
        p.append("model_server_k8s_weights_access_modes is %r: list one or more of %s (the pre-fill "
                 "writes the volume, every replica reads it: ReadWriteMany across nodes)."
                 % (modes, ", ".join(K8S_ACCESS_MODES)))
    _k8s_string_map(s.get("node_selector") or {}, "model_server_k8s_node_selector", p)
    tolerations = s.get("tolerations")
    if tolerations is not None:
        if not isinstance(tolerations, list):
            p.append("model_server_k8s_tolerations is a %s: list {key, operator, effect} items, or "
                     "leave it null (the GPU pool's taint, the resource name)." % v.type_name(tolerations))
        else:
            for index, item in enumerate(tolerations):
                where = "model_server_k8s_tolerations[%d]" % index
                if not isinstance(item, dict) or set(item) - {"key", "operator", "value", "effect"}:
                    p.append("%s is %r: set key, operator (Exists or Equal), value, effect." % (where, item))
                    continue
                _k8s_str(item.get("key"), where + ".key", p, _LABEL_KEY, "a taint key", optional=True)
                if item.get("operator", "Equal") not in ("Exists", "Equal"):
                    p.append("%s.operator is %r: set Exists or Equal." % (where, item.get("operator")))
                if item.get("effect") not in (None, "") + K8S_TAINT_EFFECTS:
                    p.append("%s.effect is %r: set one of %s." % (where, item.get("effect"), ", ".join(K8S_TAINT_EFFECTS)))
                _k8s_str(item.get("value"), where + ".value", p, _LABEL_VALUE, "a taint value", optional=True)
    gate = s.get("msa_gate_command")
    if gate is not None and (not isinstance(gate, list) or not gate
                             or any(not isinstance(t, str) or v.has_control(t) for t in gate)):
        p.append("model_server_k8s_msa_gate_command must be a list of strings without control "
                 "characters (or null: no gate).")
    # what the pod is made of
    image = spec.get("image") or {}
    if not image.get("digest") or not v.is_digest_reference(str(image.get("ref", ""))):
        p.append("image %s is not pinned by digest: a cluster pulls the image again on every new "
                 "node, so the Deployment names it by digest only; set serving_image: {digest: "
                 "'sha256:<64 hex>'} (its RepoDigests on the staging host)." % image.get("ref"))
    gpu = (spec.get("gpu") or {}).get("vendor")
    if gpu not in K8S_GPU_RESOURCE:
        p.append("GPU vendor %r has no Kubernetes device-plugin resource here (known: %s)."
                 % (gpu, ", ".join(sorted(K8S_GPU_RESOURCE))))
    elif K8S_GPU_RESOURCE[gpu] is None and (spec.get("gpu") or {}).get("count"):
        p.append("profile %s asks for %s GPUs of vendor %r, which has no device-plugin resource."
                 % (spec.get("profile"), spec["gpu"]["count"], gpu))
    weights = spec.get("weights") or {}
    if not v.is_git_commit(str(weights.get("revision") or "")):
        p.append("the weights revision %r is not a full commit sha: set serving_weights_revision "
                 "(the volume and the Job are named by it)." % weights.get("revision"))
    if not v.is_sha256(str(weights.get("manifest_sha256") or "")):
        p.append("the weights manifest of %s is not pinned: set serving_weights_manifest_sha256 (the "
                 "pre-fill Job refuses any other manifest, the pod any unverified volume)."
                 % weights.get("repo"))
    _k8s_str(s.get("prefill_image"), "model_server_k8s_prefill_image", p, v.is_digest_reference,
             "an image with sh, rsync and coreutils, by digest (registry/name@sha256:<64 hex>)")
    if spec.get("release"):
        _k8s_str(s.get("release_image"), "model_server_k8s_release_image", p, v.is_digest_reference,
                 "an image with python3 and python3-cryptography, by digest (registry/name@sha256:<64 hex>): "
                 "the pod's first init container checks the signed release in it at every start")
        if not isinstance(spec.get("release_trust"), dict) or not spec.get("release_bundle"):
            p.append("the signed release has no bundle or trust list in serving_spec: set serving_release_bundle "
                     "and serving_release_keys (the pod checks the release against them at every start).")
    _k8s_str(s.get("rsync_server"), "model_server_k8s_rsync_server", p, v.is_host,
             "the address the cluster's pods reach the staging rsync daemon at")
    _k8s_int(s.get("rsync_port"), "model_server_k8s_rsync_port", 1, 65535, p)
    _k8s_str(s.get("rsync_user"), "model_server_k8s_rsync_user", p, _RSYNC_USER, "the daemon's user name")
    path = s.get("config_container_path")
    if not isinstance(path, str) or not re.match(r"^(/[A-Za-z0-9._-]+){2,}$", path) or "/../" in path + "/":
        p.append("config_container_path %r is not an absolute file path: the engine reads --config "
                 "there (role model_server: /etc/model-server/engine.yaml)." % (path,))
    for key in ("rsync_secret", "engine_config_secret"):
        _k8s_str(s.get(key), "model_server_k8s_" + key, p, _DNS_SUBDOMAIN, "a Secret name")
    return p


def _k8s_meta(name, namespace, labels, **extra):
    meta = {"name": name, "namespace": namespace, "labels": dict(labels)}
    meta.update(extra)
    return meta


def k8s_manifests(spec, settings):
    """The Kubernetes objects that serve `spec` as `settings` say (model_server_k8s_* without
    the prefix), in apply order: Namespace, the weights PersistentVolumeClaim, the Job that
    pre-fills and verifies it from the staging mirror, the Deployment, its Service, the
    NetworkPolicy admitting only the gateway's namespace, a PodDisruptionBudget. Refused
    (AnsibleFilterError, every reason) when k8s_problems finds any. No secret value is in
    them: the engine's API key and the rsync password are Secrets referenced by name."""
    problems, objects = _k8s_checked(spec, settings)
    if problems:
        raise AnsibleFilterError("refusing to render the Kubernetes objects: " + " ".join(problems))
    return objects


def _k8s_objects(spec, settings):
    """k8s_manifests' objects, once _k8s_input_problems found nothing."""
    s = settings
    name, ns = s["name"], s["namespace"]
    weights = spec["weights"]
    revision, pin = weights["revision"], weights["manifest_sha256"]
    short = revision[:12]
    # the engine's pods only: the pre-fill pod has its own component, so no Service, policy or
    # budget ever selects it
    selector = {"app.kubernetes.io/name": K8S_APP, "app.kubernetes.io/instance": name,
                "app.kubernetes.io/component": "engine"}
    common = {"app.kubernetes.io/name": K8S_APP, "app.kubernetes.io/instance": name,
              "app.kubernetes.io/managed-by": "ansible", "minimax-m3/profile": spec["profile"],
              "minimax-m3/engine": spec["engine"]}
    labels = dict(common, **{"app.kubernetes.io/component": "engine"})
    weights_labels = dict(common, **{"app.kubernetes.io/component": "weights",
                                     "minimax-m3/revision": revision})
    pvc_name = "%s-weights-%s" % (name, short)
    resource = K8S_GPU_RESOURCE[spec["gpu"]["vendor"]]
    gpus = {"limits": {resource: spec["gpu"]["count"]}} if resource else {}
    release = "%s@%s" % (revision, spec["image"]["digest"])
    config_path = s["config_container_path"]
    image, command, args = k8s_exec(spec, engine_container_args(spec, config_path))
    container_cfg = spec.get("container") or {}

    env = [{"name": k, "value": v} for k, v in ea.engine_env(spec)]

    security = {"allowPrivilegeEscalation": not container_cfg.get("no_new_privileges"),
                "privileged": False,
                "capabilities": {"drop": list(container_cfg.get("cap_drop") or []),
                                 "add": list(container_cfg.get("cap_add") or [])},
                "readOnlyRootFilesystem": bool(container_cfg.get("read_only"))}
    pod_security = {}
    if container_cfg.get("user") is not None:
        uid, _, gid = str(container_cfg["user"]).partition(":")
        security["runAsUser"] = int(uid)
        security["runAsNonRoot"] = int(uid) != 0
        if gid:
            security["runAsGroup"] = int(gid)
            pod_security["fsGroup"] = int(gid)

    mounts = [{"name": "weights", "mountPath": weights["container_dir"], "subPath": revision, "readOnly": True},
              {"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "weights", "persistentVolumeClaim": {"claimName": pvc_name, "readOnly": True}},
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": s["shm_size"]}}]
    for index, mount in enumerate(container_cfg.get("tmpfs") or []):
        path, _, options = str(mount).partition(":")
        size = re.search(r"(?:^|,)size=([0-9]+)([kmg])(?:,|$)", options)
        empty = {"medium": "Memory"}
        if size:
            empty["sizeLimit"] = "%s%si" % (size.group(1), size.group(2).upper())
        volumes.append({"name": "tmpfs-%d" % index, "emptyDir": empty})
        mounts.append({"name": "tmpfs-%d" % index, "mountPath": path})
    if spec.get("auth"):
        volumes.append({"name": "engine-config", "secret": {
            "secretName": s["engine_config_secret"], "defaultMode": 0o440,
            "items": [{"key": "engine.yaml", "path": config_path.rsplit("/", 1)[1]}]}})
        mounts.append({"name": "engine-config", "mountPath": config_path.rsplit("/", 1)[0], "readOnly": True})
    jit = spec.get("jit_cache") or {}
    # the checks before the engine: the signed release (where there is one), then the volume
    check_security = dict(security, capabilities={"drop": ["ALL"], "add": []})
    init, release_config = [], None
    if spec.get("release"):
        release_config, release_init, release_volume = k8s_release_check(spec, s, revision, weights_labels,
                                                                         check_security)
        init.append(release_init)
        volumes.append(release_volume)
    init.append({"name": "weights-verified", "image": image, "command": ["sh", "-c", K8S_MARKER_SCRIPT],
                 "env": [{"name": "MM3_REVISION", "value": revision}, {"name": "MM3_MANIFEST_SHA256", "value": pin}],
                 "volumeMounts": [{"name": "weights", "mountPath": "/weights", "readOnly": True}],
                 "securityContext": check_security})
    # The kernel caches, every profile, the unit's variables: on an emptyDir, not the node's path.
    # It lives as long as the pod, so a container restart in it (liveness, OOM, crash) finds its
    # kernels; a new image is a new pod, so it is per image as the node's directory is; fsGroup
    # makes it the non-root engine's; and Pod Security's baseline and restricted levels refuse
    # hostPath. A new pod compiles again (the node's precompile steps do not run here: an empty
    # cache per pod would gain nothing) - docs/operations/serve.md.
    if jit.get("container_dir"):
        env += [{"name": k, "value": v} for k, v in jit_cache_env(spec)]
        volumes.append({"name": "jit-cache", "emptyDir": {"sizeLimit": s["jit_cache_size"]}})
        mounts.append({"name": "jit-cache", "mountPath": jit["container_dir"]})
        if spec.get("msa_warmup") and s.get("msa_gate_command"):
            gate_image, gate_command, gate_args = k8s_exec(spec, invocation(spec, s["msa_gate_command"]))
            gate = {"name": "msa-gate", "image": gate_image, "args": gate_args,
                    "env": list(env),
                    "resources": gpus,
                    "volumeMounts": [m for m in mounts if m["name"] in ("jit-cache", "shm")],
                    "securityContext": security}
            if gate_command:
                gate["command"] = gate_command
            init.append(gate)
    probe = {"httpGet": {"path": spec.get("health_path") or "/health", "port": "http"},
             "timeoutSeconds": 10, "periodSeconds": s["probe_period_s"]}
    engine = {"name": "engine", "image": image, "imagePullPolicy": "IfNotPresent"}
    if command:
        engine["command"] = command
    engine.update({
        "args": args,
        "ports": [{"name": "http", "containerPort": spec["container_port"], "protocol": "TCP"}],
        "env": env,
        "resources": gpus,
        "volumeMounts": mounts,
        "securityContext": security,
        # the long load: up to startup_timeout_s before the first 200, then ready/alive checks
        "startupProbe": dict(probe, failureThreshold=-(-s["startup_timeout_s"] // s["probe_period_s"])),
        "readinessProbe": dict(probe, failureThreshold=3),
        "livenessProbe": dict(probe, periodSeconds=max(30, s["probe_period_s"]), failureThreshold=5),
    })
    # the signed release, where there is one: a new one is a new pod, which checks it at start
    pod_annotations = dict({"minimax-m3/release": release},
                           **({"minimax-m3/signed-release": spec["release"]["digest"]} if spec.get("release") else {}))
    pod = {"automountServiceAccountToken": False, "enableServiceLinks": False,
           "terminationGracePeriodSeconds": s["stop_timeout_s"],
           "tolerations": s["tolerations"] if s.get("tolerations") is not None else
           [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}] if resource else [],
           "initContainers": init, "containers": [engine], "volumes": volumes}
    if s.get("node_selector"):
        pod["nodeSelector"] = dict(s["node_selector"])
    # the container runtime's default seccomp filter on every pod (Pod Security "restricted"
    # requires it; docker applies its own default to the node's container, Kubernetes none)
    pod["securityContext"] = dict(pod_security, seccompProfile=K8S_SECCOMP)

    pvc_spec = {"accessModes": list(s["weights_access_modes"]), "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": s.get("weights_size") or
                                           _k8s_quantity_gi(weights["size_gb"], 0.10)}}}
    if s.get("weights_storage_class"):
        pvc_spec["storageClassName"] = s["weights_storage_class"]
    prefill_env = [{"name": k, "value": str(v)} for k, v in (
        ("MM3_REPO", weights["repo"]), ("MM3_REVISION", revision), ("MM3_MANIFEST_SHA256", pin),
        ("MM3_RSYNC_SERVER", s["rsync_server"]), ("MM3_RSYNC_PORT", s["rsync_port"]),
        ("MM3_RSYNC_USER", s["rsync_user"]), ("MM3_BWLIMIT", s["prefill_bwlimit"]))]
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": _k8s_meta("%s-weights-prefill-%s" % (name, short), ns, weights_labels),
           "spec": {"backoffLimit": 3, "activeDeadlineSeconds": s["prefill_timeout_s"],
                    "template": {"metadata": {"labels": weights_labels}, "spec": {
                        "restartPolicy": "Never", "automountServiceAccountToken": False,
                        "securityContext": {"seccompProfile": K8S_SECCOMP},
                        "enableServiceLinks": False,
                        "containers": [{
                            "name": "prefill", "image": s["prefill_image"], "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", K8S_PREFILL_SCRIPT], "env": prefill_env,
                            "volumeMounts": [{"name": "weights", "mountPath": "/weights"},
                                             {"name": "rsync-password", "mountPath": "/etc/weights_sync",
                                              "readOnly": True}],
                            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                                                "capabilities": {"drop": ["ALL"],
                                                                 "add": ["CHOWN", "FOWNER", "DAC_OVERRIDE"]}}}],
                        "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": pvc_name}},
                                    {"name": "rsync-password", "secret": {
                                        "secretName": s["rsync_secret"], "defaultMode": 0o400,
                                        "items": [{"key": "password", "path": "rsync.password"}]}}]}}}}
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "app.kubernetes.io/managed-by": "ansible"}}},
    ] + ([release_config] if release_config else []) + [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": _k8s_meta(pvc_name, ns, weights_labels), "spec": pvc_spec},
        job,
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": _k8s_meta(name, ns, labels, annotations={"minimax-m3/release": release}),
         "spec": {"replicas": s["replicas"], "selector": {"matchLabels": selector},
                  # no surge: a second 8-GPU pod has nowhere to go; one pod at a time instead
                  "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                  "template": {"metadata": {"labels": labels, "annotations": pod_annotations},
                               "spec": pod}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _k8s_meta(name, ns, labels),
         "spec": {"type": "ClusterIP", "selector": selector,
                  "ports": [{"name": "http", "port": spec["port"], "targetPort": "http", "protocol": "TCP"}]}},
        # The engine answers the gateway and reaches nothing (it runs offline: HF_HUB_OFFLINE,
        # weights and kernels on its volumes); an empty egress list with Egress in policyTypes
        # denies all of it.
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": _k8s_meta(name + "-from-gateway", ns, labels),
         "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress", "Egress"],
                  "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": s["gateway_namespace"]}}}],
                      "ports": [{"protocol": "TCP", "port": spec["container_port"]}]}],
                  "egress": []}},
        # The pre-fill pod reaches the staging host's rsync daemon and nothing else (and DNS
        # when the daemon is named, not addressed); nothing reaches it.
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": _k8s_meta("%s-weights-prefill" % name, ns, weights_labels),
         "spec": {"podSelector": {"matchLabels": {k: weights_labels[k] for k in (
                      "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")}},
                  "policyTypes": ["Ingress", "Egress"], "ingress": [],
                  "egress": k8s_prefill_egress(s["rsync_server"], s["rsync_port"])}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _k8s_meta(name, ns, labels),
         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}}},
    ]
    return objects


# What an API server admits of one object (kubernetes pkg/apis/core/validation/validation.go,
# ValidateConfigMap: a ConfigMap's data and binaryData values, their lengths in bytes summed, at
# most core.MaxSecretSize, 1 MiB; apimachinery pkg/api/validation/objectmeta.go,
# ValidateAnnotationsSize: an object's annotations, keys and values summed, at most
# TotalAnnotationSizeLimitB, 256 KiB), with the annotation that kubernetes.core.k8s apply: true
# adds to every object it applies (plugins/module_utils/apply.py, annotate: the object itself as
# compact JSON, keys sorted).
K8S_CONFIGMAP_MAX = 1024 * 1024
K8S_ANNOTATIONS_MAX = 256 * 1024
K8S_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def k8s_size_problems(objects):
    """Each rendered object an API server would refuse for its size, as role model_server_k8s
    applies it (kubernetes.core.k8s apply: true), with its largest data items and the fix; empty
    when all fit. Checked before the first object is applied, so a refusal leaves the cluster as
    it was instead of half-applied."""
    problems = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        what = "%s %s" % (obj.get("kind"), meta.get("name"))
        data = {key: len(value.encode()) for key, value in (obj.get("data") or {}).items()}
        data.update((key, len(base64.b64decode(value))) for key, value in (obj.get("binaryData") or {}).items())
        largest = ", ".join("%s %s bytes" % (key, format(size, ",")) for key, size in sorted(
            data.items(), key=lambda item: (-item[1], item[0]))[:3])
        annotations = dict(meta.get("annotations") or {})
        annotations[K8S_LAST_APPLIED] = json.dumps(obj, separators=(",", ":"), sort_keys=True)
        annotated = sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())
        fix = ("; its largest items: %s. The bundle grows with the files the signed release lists, the "
               "trust list with serving_release_keys (retire the keys no release needs); a release too "
               "large to check in a pod is served from nodes (playbooks/site.yml), whose start check has "
               "no such limit." % largest) if data else (
               ": shorten the model_server_k8s_* and serving_* values it is rendered from.")
        if obj.get("kind") == "ConfigMap" and sum(data.values()) > K8S_CONFIGMAP_MAX:
            problems.append("%s would hold %s bytes of data, more than the %s an API server admits in one "
                            "ConfigMap%s" % (what, format(sum(data.values()), ","), format(K8S_CONFIGMAP_MAX, ","), fix))
        if annotated > K8S_ANNOTATIONS_MAX:
            problems.append("%s would carry %s bytes of annotations once applied (%s, the object itself, "
                            "which kubernetes.core.k8s apply: true records), more than the %s an API server "
                            "admits on one object%s" % (what, format(annotated, ","), K8S_LAST_APPLIED,
                                                       format(K8S_ANNOTATIONS_MAX, ","), fix))
    return problems


# The signed release's check at every pod start (issue 33): the node unit's ExecStartPre script
# (roles/model_server/files/check_release.py) and the shared code it imports, as the node has them
# (helper_files), with the bundle and the trust list, in one ConfigMap laid out as on the node.
K8S_RELEASE_DIR = "/release"
K8S_RELEASE_CHECKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                   "roles", "model_server", "files", "check_release.py")


def k8s_release_check(spec, s, revision, labels, security):
    """(ConfigMap, init container, volume) that refuse to start the pod unless the signed release
    verifies, offline, in the pod against the trust list in the ConfigMap (release_keys less
    release_revoked: once playbooks/release-trust.yml patches a revocation in, the next start is
    refused), and signs exactly the manifest the pre-fill wrote into the weights volume:
    check_release.py, the node's own check, without the unit part (the objects are rendered from
    the same spec). The weights-verified container after it binds the volume's bytes to that
    manifest."""
    config = k8s_release_trust(spec, s)
    name = config["metadata"]["name"]
    data = dict(config["data"], **{"check_release.py": _read(K8S_RELEASE_CHECKER),
                                   "release.sig.json": spec["release_bundle"]})
    items = [{"key": key, "path": key} for key in data]
    for helper in helper_files(""):
        relpath = helper["dest"].lstrip("/")
        key = relpath.replace("/", "__")
        data[key] = helper["content"] if "content" in helper else _read(helper["src"])
        items.append({"key": key, "path": relpath})
    config.update(metadata=_k8s_meta(name, s["namespace"], labels,
                                     annotations={"minimax-m3/signed-release": spec["release"]["digest"]}),
                  data=data)
    command = ["python3", K8S_RELEASE_DIR + "/check_release.py",
               "--bundle", K8S_RELEASE_DIR + "/release.sig.json", "--trust", K8S_RELEASE_DIR + "/release-trust.json",
               "--digest", spec["release"]["digest"], "--manifest", "/weights/%s.manifest.sha256" % revision]
    init = {"name": "release-verified", "image": s["release_image"], "imagePullPolicy": "IfNotPresent",
            "command": command, "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
            "volumeMounts": [{"name": "release", "mountPath": K8S_RELEASE_DIR, "readOnly": True},
                             {"name": "weights", "mountPath": "/weights", "readOnly": True}],
            "securityContext": security}
    volume = {"name": "release", "configMap": {"name": name, "defaultMode": 0o444, "items": items}}
    return config, init, volume


def k8s_release_trust(spec, settings):
    """The trust part of the release check's ConfigMap: its name and namespace and the trust list
    (release_keys less release_revoked, as a node's release-trust.json). k8s_release_check builds
    the ConfigMap on it; playbooks/release-trust.yml patches only this into a cluster, so a
    revocation reaches the pods while k8s.yml refuses the revoked release."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "%s-release" % settings["name"], "namespace": settings["namespace"]},
            "data": {"release-trust.json": release_trust_text(spec["release_trust"])}}


def release_trust_text(trust):
    """The text of a release-trust.json (serving_spec.release_trust: the keys and revocations a
    start check reads), one form for the node's file (role model_server, tasks/trust.yml) and the
    pods' ConfigMap: JSON, keys sorted, 4-space indent, as Ansible's to_nice_json writes it."""
    return json.dumps(trust, indent=4, sort_keys=True) + "\n"


def _read(path):
    with open(path) as handle:
        return handle.read()


def k8s_prefill_egress(server, port):
    """The pre-fill pod's egress rules: the rsync daemon's port, at its address when the server
    is one (a /32 or /128), else at any address plus DNS (port 53, UDP and TCP) to resolve it."""
    rsync = {"ports": [{"protocol": "TCP", "port": int(port)}]}
    address = v.ip_address(server)
    if address is not None:
        return [dict(rsync, to=[{"ipBlock": {"cidr": "%s/%d" % (address, address.max_prefixlen)}}])]
    return [rsync, {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]


class _K8sDumper(yaml.SafeDumper):
    """Block lists indented under their key; multi-line strings (the scripts) as literal blocks."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _k8s_str_representer(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_K8sDumper.add_representer(str, _k8s_str_representer)


def k8s_yaml(obj):
    """One object as a YAML document for review and apply (keys in the order built)."""
    obj = json.loads(json.dumps(obj))  # plain types: Ansible hands its own dict and str subclasses
    return yaml.dump(obj, Dumper=_K8sDumper, sort_keys=False, default_flow_style=False, width=100)



# The unit's ExecStartPre weights re-check (files/check_weights.py) runs on the node without
# Ansible: it imports the shared code by the same name the modules do, from a copy of the
# collection's layout beside it. These are the shared modules it needs (weights_common and what
# weights_common imports), and release_signing for the signed release's start check
# (files/check_release.py; it needs python3-cryptography, which the role installs only for a
# signed release); tests/unit/test_weights_modules.py runs the installed form.
HELPER_SHARED_MODULES = ("weights_common", "validation", "release_signing", "docker_run")
SHARED_PACKAGE = "ansible_collections.mm3.shared.plugins.module_utils"


def helper_files(libexec_dir):
    """[{src or content, dest, mode}] of what the weights re-check needs beside it: the shared
    modules it imports, each from its source as the controller's collection loader finds it (one
    home, never a copy kept in the role), under <libexec_dir>/ansible_collections/mm3/shared/
    plugins/module_utils/; and an __init__.py that makes that ansible_collections a regular
    package, so a node's own ansible_collections (an ansible package) cannot shadow it."""
    root = str(libexec_dir).rstrip("/")
    dest_dir = "%s/%s" % (root, SHARED_PACKAGE.replace(".", "/"))
    files = [{"content": "# The shared code of check_weights.py (Ansible: model_server).\n",
              "dest": "%s/ansible_collections/__init__.py" % root, "mode": "0644"}]
    files += [{"src": importlib.import_module("%s.%s" % (SHARED_PACKAGE, name)).__file__,
               "dest": "%s/%s.py" % (dest_dir, name), "mode": "0644"} for name in HELPER_SHARED_MODULES]
    return files


def unit_problems(spec):
    """What the rendered unit could not start with although serving_spec resolves, one line each
    naming the fix: the ExecStartPre weights re-check compares the manifest with the pinned
    sha256, so without a pin every start is refused."""
    weights = (spec or {}).get("weights") or {}
    problems = []
    if not v.is_sha256(weights.get("manifest_sha256") or ""):
        problems.append("serving_weights_manifest_sha256 is not pinned for %s@%s: the unit's ExecStartPre "
                        "re-check refuses every start without it (and nodes refuse to sync against none): run "
                        "playbooks/weights.yml on the staging host, review the manifest it prints and set "
                        "serving_weights_manifest_sha256 to its sha256."
                        % (weights.get("repo"), weights.get("revision")))
    return problems


def env_sources(spec):
    """["NAME=VALUE", source] of every variable the engine's container gets, in the order of its
    -e options (engine_env, then the kernel cache's): the plan prints them beside the flags."""
    spec = spec or {}
    profile_env = spec.get("env") or {}
    origin = spec.get("source") or "matrix"
    result = []
    for name, value in ea.engine_env(spec):
        if name == "HF_HUB_OFFLINE":
            source = "seed: the offline start (no hub call from the node)"
        elif name == (spec.get("output_cap") or {}).get("env"):
            source = "project: the engine's own output cap (serving_max_output_tokens)"
        elif name in ((spec.get("container") or {}).get("env") or {}):
            source = "the engine's container settings (serving_engines / the profile's container.env)"
        else:
            source = "%s (the profile's engine env)" % origin if name in profile_env else "project"
        result.append(["%s=%s" % (name, value), source])
    for name, value in jit_cache_env(spec):
        result.append(["%s=%s" % (name, value), "project: the kernel cache, one per image (jit_cache)"])
    return result


def deploy_blockers(spec):
    """Everything that stops a deployment of serving_spec: the serving role's blockers, then
    what the unit could not start with (unit_problems). The one list the plan, the rollout's
    plan and the model_server role judge a deployment by."""
    spec = spec or {}
    return list(spec.get("blockers") or []) + (unit_problems(spec) if spec.get("weights") else [])


def command_tokens(text):
    """Split a rendered shell command back into argv (line continuations removed)."""
    return shlex.split(text.replace("\\\n", " "))


class FilterModule(object):
    """model_server_docker_argv, model_server_deploy_blockers, model_server_env_sources,
    model_server_hardening_args, model_server_msa_gate_argv, model_server_precompile_argv,
    model_server_precompile_steps, model_server_invocation, model_server_helper_files,
    model_server_shell_join, model_server_systemd_join, model_server_k8s_manifests,
    model_server_k8s_problems, model_server_k8s_release_trust, model_server_k8s_yaml,
    model_server_release_trust_text."""

    def filters(self):
        return {
            "model_server_docker_argv": docker_run_argv,
            "model_server_deploy_blockers": deploy_blockers,
            "model_server_env_sources": env_sources,
            "model_server_hardening_args": hardening_args,
            "model_server_helper_files": helper_files,
            "model_server_invocation": invocation,
            "model_server_msa_gate_argv": msa_gate_argv,
            "model_server_precompile_argv": precompile_argv,
            "model_server_precompile_steps": precompile_steps,
            "model_server_shell_join": shell_join,
            "model_server_systemd_join": systemd_join,
            "model_server_k8s_manifests": k8s_manifests,
            "model_server_k8s_release_trust": k8s_release_trust,
            "model_server_release_trust_text": release_trust_text,
            "model_server_k8s_problems": k8s_problems,
            "model_server_k8s_yaml": k8s_yaml,
        }
