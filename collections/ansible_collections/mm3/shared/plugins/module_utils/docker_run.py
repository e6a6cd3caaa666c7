# -*- coding: utf-8 -*-
"""`docker run` argv: how the project builds the part after the options, and how Docker's CLI reads
a whole argv back (issue 33: the node's start check compares the unit's ExecStart, as systemd
parsed it, with the signed release).

One home for both directions: filter_plugins/model_server.py builds the unit's `docker run` with
invocation/server_invocation, and roles/model_server/files/check_release.py reads the unit back
with parse_run and compares it with run_differences. Pure functions; nothing here runs Docker.
"""

from __future__ import annotations

import posixpath

# Options of `docker run` that take a value (docs.docker.com/reference/cli/docker/container/run/,
# Docker 20.10 to 28): Docker's CLI (spf13/pflag, interspersed off) reads options up to the first
# token that is none, the image; a value may follow as the next token or after '=' (a one-letter
# option also glued: -eK=V). An option in neither list is refused: the check cannot know where
# the image is.
VALUE_OPTIONS = frozenset("""
-a --attach --add-host --annotation --blkio-weight --blkio-weight-device --cap-add --cap-drop
--cgroup-parent --cgroupns --cidfile --cpu-count --cpu-percent --cpu-period --cpu-quota
--cpu-rt-period --cpu-rt-runtime -c --cpu-shares --cpus --cpuset-cpus --cpuset-mems --detach-keys
--device --device-cgroup-rule --device-read-bps --device-read-iops --device-write-bps
--device-write-iops --dns --dns-option --dns-search --domainname --entrypoint -e --env --env-file
--expose --gpus --group-add --health-cmd --health-interval --health-retries --health-start-interval
--health-start-period --health-timeout -h --hostname --ip --ip6 --ipc --isolation --kernel-memory
-l --label --label-file --link --link-local-ip --log-driver --log-opt --mac-address -m --memory
--memory-reservation --memory-swap --memory-swappiness --mount --name --network --net
--network-alias --net-alias --oom-score-adj --pid --pids-limit --platform -p --publish --pull
--restart --runtime --security-opt --shm-size --stop-signal --stop-timeout --storage-opt --sysctl
--tmpfs --ulimit -u --user --userns --uts -v --volume --volume-driver --volumes-from -w --workdir
""".split())
FLAG_OPTIONS = frozenset("""
-d --detach --disable-content-trust --init -i --interactive --no-healthcheck --oom-kill-disable
--privileged -P --publish-all -q --quiet --read-only --rm --sig-proxy -t --tty --use-api-socket
""".split())


class RunError(ValueError):
    """An argv this module cannot read as `docker run`."""


def invocation(image, command, replace_entrypoint):
    """What follows `docker run [options]` to run `command` in `image`: the image and the command,
    or, with replace_entrypoint (an image whose ENTRYPOINT must not prefix it, vllm/vllm-openai's
    `vllm serve`), --entrypoint CMD0 IMAGE CMD1..."""
    command = [str(token) for token in command]
    if replace_entrypoint:
        return ["--entrypoint", command[0], image] + command[1:]
    return [image] + command


def server_invocation(image, command, entrypoint):
    """The image and the server command: only the arguments when the command starts with the
    image's ENTRYPOINT `entrypoint` (the image's own convention, like a Kubernetes `args:`), else
    invocation with the ENTRYPOINT replaced where the image has one."""
    entrypoint = [str(token) for token in entrypoint or []]
    command = [str(token) for token in command or []]
    if entrypoint and command[:len(entrypoint)] == entrypoint:
        return [image] + command[len(entrypoint):]
    return invocation(image, command, bool(entrypoint))


def hardening_args(container):
    """The least-privilege options of serving_spec.container, in a fixed order:
    --security-opt no-new-privileges, --cap-drop X.., --cap-add X.., --pids-limit N,
    --read-only, --tmpfs PATH[:opts].., --user UID[:GID]. Empty for an empty dict. The one home of
    these options: the unit renders them (filter model_server_hardening_args) and a release signs
    them (container_options)."""
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


def container_options(spec):
    """The docker run options a release signs as its `container` part: the profile's device options
    (serving_spec.device_args) and the least-privilege ones (hardening_args), as the unit renders
    them."""
    spec = spec or {}
    return [str(a) for a in spec.get("device_args") or []] + hardening_args(spec.get("container"))


# The options that give the container devices or privileges, or take them away: a unit must have
# exactly the signed ones (container_options), and none of the others (the unit never renders
# --privileged, a user namespace, the host's PID or UTS namespace, ...). -u is --user.
PRIVILEGE_OPTIONS = frozenset("""
--gpus --device --device-cgroup-rule --group-add --security-opt --cap-add --cap-drop --pids-limit
--read-only --tmpfs --user -u --privileged --userns --pid --uts --cgroupns --runtime
""".split())


def _privilege_pairs(options):
    """(name, value) of each privilege option, as Docker reads it: -u is --user, a flag given as
    --flag or --flag=true is one thing (--read-only=false is not)."""
    pairs = []
    for name, value in options:
        if name not in PRIVILEGE_OPTIONS:
            continue
        name = "--user" if name == "-u" else name
        if name in FLAG_OPTIONS and value is not None and value.lower() in ("true", "1"):
            value = None
        pairs.append((name, value))
    return pairs


def container_differences(parsed, signed_options):
    """Where the privilege options of a parsed `docker run` (parse_run) differ from the signed
    container options (container_options): ['adds --privileged', 'lacks --read-only', ...], []
    when they are the same options, each as often."""
    try:
        signed = parse_run(["docker", "run"] + [str(a) for a in signed_options] + ["IMAGE"])["options"]
    except RunError as error:
        return ["the signed container options cannot be read: %s" % error]
    have, want = _privilege_pairs(parsed["options"]), _privilege_pairs(signed)

    def show(pair):
        return pair[0] if pair[1] is None else ("%s=%s" if pair[0] in FLAG_OPTIONS else "%s %s") % pair
    out = []
    for pair in have:
        if have.count(pair) > want.count(pair) and "adds " + show(pair) not in out:
            out.append("adds " + show(pair))
    for pair in want:
        if want.count(pair) > have.count(pair) and "lacks " + show(pair) not in out:
            out.append("lacks " + show(pair))
    return out


def pinned_tag(repository, digest):
    """The tag image_carry gives an image it loaded by `docker load` (which keeps no repo digest):
    repository:pinned-<hex> for the digest sha256:<hex>. The one home of that name: serving's image_local_tag
    (what the unit runs) and release_signing's image_names (what the node's check accepts)."""
    return "%s:pinned-%s" % (repository, str(digest).split(":", 1)[1])


def parse_run(argv):
    """Read argv as Docker's CLI does: {'options': [(name, value or None)], 'image', 'args'}.
    argv[0] is the docker binary and argv[1] must be `run`. RunError names what cannot be read."""
    argv = [str(token) for token in argv]
    if len(argv) < 2 or argv[1] != "run":
        raise RunError("the unit's ExecStart is not `docker run ...` (it is %r)" % " ".join(argv[:3]))
    options, index = [], 2
    while index < len(argv):
        token = argv[index]
        if token == "--":
            index += 1
            break
        if not token.startswith("-") or token == "-":
            break
        if token.startswith("--"):
            name, eq, value = token.partition("=")
        elif len(token) > 2:
            # -eK=V or -e=K=V: the value glued to a one-letter option
            name, eq, value = token[:2], "=", token[3:] if token[2] == "=" else token[2:]
        else:
            name, eq, value = token, "", ""
        if name in FLAG_OPTIONS:
            if eq and not name.startswith("--"):
                raise RunError("the unit's docker run has %s, one-letter options run together, which this "
                               "check does not read" % token)
            options.append((name, value if eq else None))
        elif name in VALUE_OPTIONS:
            if not eq:
                index += 1
                if index >= len(argv):
                    raise RunError("docker option %s has no value" % name)
                value = argv[index]
            options.append((name, value))
        else:
            raise RunError("the unit's docker run has option %s, which this check does not know (its "
                           "value and the image cannot be told apart)" % name)
        index += 1
    if index >= len(argv):
        raise RunError("the unit's docker run names no image")
    return {"options": options, "image": argv[index], "args": argv[index + 1:]}


def option_values(parsed, *names):
    """The values of the options called any of `names`, in order."""
    return [value for name, value in parsed["options"] if name in names]


def _mount_option(value):
    """A --mount value (CSV of key=value, `readonly` alone allowed) as {type, source, target,
    readonly}, as Docker reads it: src/source, dst/destination/target, ro/readonly."""
    fields = {}
    for item in str(value).split(","):
        key, eq, val = item.strip().partition("=")
        fields[key.strip().lower()] = val.strip() if eq else None
    readonly = next((fields[k] for k in ("readonly", "ro") if k in fields), False)
    return {"type": fields.get("type") or "volume",
            "source": next((fields[k] for k in ("source", "src") if fields.get(k)), None),
            "target": next((fields[k] for k in ("target", "destination", "dst") if fields.get(k)), None),
            "readonly": readonly is None or str(readonly).lower() in ("1", "true")}


def mounts(parsed):
    """Every mount parse_run's options give the container, in order: [{option, value, type,
    source, target, readonly}] - -v/--volume SRC:DST[:OPTS] (a single path: an anonymous
    volume there; `ro` among OPTS: read-only), --mount CSV, --tmpfs DST[:OPTS] - with the target
    normalised; --volumes-from is returned with target None (its mounts are another container's)."""
    out = []
    for name, value in parsed["options"]:
        value = str(value)
        if name in ("-v", "--volume"):
            parts = value.split(":")
            source, target, opts = (None, parts[0], "") if len(parts) == 1 else (
                parts[0], parts[1], ":".join(parts[2:]))
            entry = {"type": "bind" if source and source.startswith("/") else "volume", "source": source,
                     "target": target, "readonly": "ro" in opts.split(",")}
        elif name == "--mount":
            entry = _mount_option(value)
        elif name == "--tmpfs":
            entry = {"type": "tmpfs", "source": None, "target": value.split(":", 1)[0], "readonly": False}
        elif name == "--volumes-from":
            entry = {"type": "volumes-from", "source": value, "target": None, "readonly": False}
        else:
            continue
        if entry["target"]:
            entry["target"] = posixpath.normpath(entry["target"])
        out.append(dict(entry, option=name, value=value))
    return out
