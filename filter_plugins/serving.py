# -*- coding: utf-8 -*-
"""Filters of the `serving` role: resolve the site choices against the hardware matrix.

The role stays thin: it gathers the site-level variables and the matrix, calls
`serving_resolve`, and either fails with the blockers or sets the one fact `serving_spec`.
Everything that decides something lives here, as pure functions that pytest calls directly
(tests/unit/test_serving_filters.py).

Merging follows Ansible's own `combine(recursive=True)` (imported, not re-implemented):
dictionaries merge key by key, lists and scalars are replaced.
"""
from __future__ import annotations

import ipaddress
import posixpath
import re

from ansible.plugins.filter.core import combine

REVISION_RE = re.compile(r"^[0-9a-f]{40}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
KNOWN_CAPABILITIES = ("text", "reasoning", "tools", "image", "video")
# Flags that carry the tensor-parallel size, per engine.
TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size", "-tp")
# Inside the container the model always sits under /models/<repo basename>, read-only.
CONTAINER_MODELS_ROOT = "/models"
# The container's least-privilege settings (serving_engines.<engine>.container, merged with an
# entry's engines.<engine>.container): every key, with its default when absent.
CONTAINER_DEFAULTS = {"no_new_privileges": True, "cap_drop": ["ALL"], "cap_add": [],
                      "pids_limit": None, "read_only": False, "tmpfs": [], "user": None, "env": {}}
# Matched whole (fullmatch): a trailing newline is refused too.
CAPABILITY_RE = re.compile(r"ALL|(CAP_)?[A-Z][A-Z_]*")
USER_RE = re.compile(r"[0-9]+(:[0-9]+)?")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TMPFS_RE = re.compile(r"/[A-Za-z0-9_./-]*(:[A-Za-z0-9_=,.-]+)?")


def merge(base, *overrides):
    """combine(recursive=True) of a matrix entry with site overrides (None/{} ignored)."""
    result = dict(base or {})
    for override in overrides:
        if override:
            result = combine(result, override, recursive=True)
    return result


def is_loopback(address):
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if str(address).strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(address).strip()).is_loopback
    except ValueError:
        return False


def apply_presets(args, presets, names):
    """Apply tuning presets to an args list ([[flag, value], [flag]] ...).

    A preset is {flag: value}: the value of a flag already in args is replaced in place,
    a flag not there is appended. Returns (new_args, unknown_preset_names).
    """
    result = [list(a) for a in args]
    unknown = []
    for name in names or []:
        if name not in presets:
            unknown.append(name)
            continue
        for flag, value in presets[name].items():
            for arg in result:
                if arg[0] == flag:
                    arg[1:] = [str(value)]
                    break
            else:
                result.append([flag, str(value)])
    return result, unknown


def flatten_args(args):
    """[[--tp, '8'], [--flag]] -> ['--tp', '8', '--flag'] (all strings)."""
    return [str(token) for arg in args for token in arg]


def tp_from_args(args):
    """The tensor-parallel size an args list sets, or None."""
    for arg in args:
        if arg and arg[0] in TP_FLAGS and len(arg) > 1:
            return str(arg[1])
    return None


def image_ref(image):
    """What docker run/pull/save uses for an image.

    repository@sha256:... for a registry image pinned by its repo digest; for a local image
    (`local_id: true`, loaded with docker load, which has no repo digest) the image ID itself
    (sha256:<64 hex>, docker accepts it as an image reference); repository:tag when unpinned.
    """
    digest = image.get("digest")
    if digest:
        if image.get("local_id"):
            return digest
        return "%s@%s" % (image.get("repository"), digest)
    tag = image.get("tag") or image.get("tag_family") or "latest"
    return "%s:%s" % (image.get("repository"), tag)


def image_local_tag(image):
    """The local tag under which a node keeps an image it received by `docker load`.

    docker save/load keeps no repo digest, so on an air-gapped node `repository@sha256:...`
    cannot resolve. image_carry tags the loaded image (after checking its ID against the one
    staging pulled by digest) as repository:pinned-<digest hex>; model_server runs it under
    that name when the digest reference does not resolve. None when there is no digest.
    """
    digest = image.get("digest")
    if not digest or image.get("local_id") or not DIGEST_RE.match(str(digest)):
        return None
    return "%s:pinned-%s" % (image.get("repository"), str(digest).split(":", 1)[1])


def _int_or_none(value):
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return value  # caller reports it


def container_settings(engine_facts, entry_engine, engine):
    """The container's least-privilege settings for one engine of one entry, and the
    blockers for values that would render a `docker run` that cannot start (each names the
    fix). Engine-wide facts first, the entry's (and the site's overrides) merged over them."""
    settings = merge(CONTAINER_DEFAULTS, (engine_facts or {}).get("container"),
                     (entry_engine or {}).get("container"))
    where = "serving_profile_overrides.engines.%s.container" % engine
    blockers = []
    for key in ("no_new_privileges", "read_only"):
        if not isinstance(settings[key], bool):
            blockers.append("%s.%s is %r: set true or false." % (where, key, settings[key]))
    for key in ("cap_drop", "cap_add"):
        caps = settings[key]
        if not isinstance(caps, list) or not all(isinstance(c, str) and CAPABILITY_RE.fullmatch(c)
                                                 for c in caps):
            blockers.append("%s.%s is %r: give a list of capability names (ALL, NET_BIND_SERVICE, "
                            "...)." % (where, key, caps))
    pids = settings["pids_limit"]
    if pids is not None and (isinstance(pids, bool) or not isinstance(pids, int)
                             or not 1 <= pids <= 4194304):
        blockers.append("%s.pids_limit is %r: give a whole number of processes between 1 and "
                        "4194304 (or null for none)." % (where, pids))
    tmpfs = settings["tmpfs"]
    if not isinstance(tmpfs, list) or not all(isinstance(t, str) and TMPFS_RE.fullmatch(t)
                                              for t in tmpfs):
        blockers.append("%s.tmpfs is %r: give a list of absolute paths, each optionally with "
                        "mount options (/tmp:rw,size=1g)." % (where, tmpfs))
    user = settings["user"]
    if user is not None and not (isinstance(user, str) and USER_RE.fullmatch(user)):
        blockers.append("%s.user is %r: give a numeric uid[:gid] (e.g. \"65534:65534\") or null "
                        "for the image's user." % (where, user))
    env = settings["env"]
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and ENV_NAME_RE.fullmatch(k) and isinstance(v, str)
            and not any(ord(ch) < 32 or ord(ch) == 127 for ch in v) for k, v in env.items()):
        blockers.append("%s.env is %r: give a mapping of variable names to one-line strings."
                        % (where, env))
    return settings, blockers


def serving_resolve(matrix, profile="", engine="sglang", weights_repos=None, engines=None,
                    device_args=None, tuning_presets=None, allow_inferred=False,
                    bind_address="127.0.0.1", port=30000, api_key_set=False, image=None,
                    allow_unpinned_image=False, weights_revision="", weights_root="/data/models",
                    profile_overrides=None, tuning=None, capabilities=None, gpu_count=None,
                    allow_request_logging=False):
    """Resolve the site choices into serving_spec. Never raises for bad input: every problem
    becomes one line in spec['blockers'], each naming the fix."""
    weights_repos = weights_repos or {}
    engines = engines or {}
    device_args = device_args or {}
    tuning_presets = tuning_presets or {}
    blockers = []
    profiles = sorted(matrix)
    profile = str(profile or "").strip()

    spec = {
        "profile": profile, "description": None, "status": None, "engine": engine,
        "gpu": {}, "tp": None, "capabilities": [], "weights": {}, "image": {},
        "device_args": [], "bind_address": bind_address, "port": None, "container_port": None,
        "health_path": None, "args": [], "env": {}, "command": [], "msa_warmup": False,
        "auth": bool(api_key_set), "tuning": list(tuning or []), "container": {},
        "blockers": blockers,
    }

    if profile not in matrix:
        what = "is not set" if not profile else "'%s' is not in the hardware matrix" % profile
        blockers.append("serving_profile %s; valid profiles: %s. Set serving_profile to one of them."
                        % (what, ", ".join(profiles)))
        return spec

    entry = merge(matrix[profile], profile_overrides)
    gpu = dict({"vendor": None, "model": None, "count": 0, "name_match": None,
                "driver_floor": None, "rocm_floor": None, "fabric": None}, **entry.get("gpu", {}))
    tp = int(entry.get("tp") or 0)
    spec.update(description=entry.get("description"), status=entry.get("status"), gpu=gpu, tp=tp)

    # Validation status: inferred rows need an explicit acknowledgement.
    if entry.get("status") != "validated" and not allow_inferred:
        blockers.append("profile '%s' has status '%s' (not validated upstream): set "
                        "serving_allow_inferred: true to acknowledge it." % (profile, entry.get("status")))

    # GPU count declared in the inventory (serving_gpu_count) against TP.
    declared = _int_or_none(gpu_count)
    if declared is not None:
        expected = tp if gpu["vendor"] != "cpu" else 0
        if declared != expected:
            blockers.append("serving_gpu_count is %s but profile '%s' needs %s GPUs (TP %s): fix "
                            "serving_gpu_count in the inventory or choose the profile that matches "
                            "this node." % (declared, profile, expected, tp))

    # Capabilities: a subset of the entry's boundary; never video; no image on ROCm.
    boundary = list(entry.get("capabilities") or [])
    wanted = list(capabilities) if capabilities else list(boundary)
    for cap in wanted:
        if cap == "video":
            blockers.append("serving_capabilities includes 'video': video input is not validated "
                            "in any recipe of this matrix; remove it.")
        elif cap == "image" and gpu["vendor"] == "amd":
            blockers.append("serving_capabilities includes 'image' on ROCm profile '%s': vision is "
                            "not validated on ROCm; remove it." % profile)
        elif cap not in KNOWN_CAPABILITIES:
            blockers.append("serving_capabilities includes unknown '%s'; known: %s."
                            % (cap, ", ".join(KNOWN_CAPABILITIES)))
        elif cap not in boundary:
            blockers.append("serving_capabilities includes '%s', outside profile '%s' boundary [%s]; "
                            "remove it." % (cap, profile, ", ".join(boundary)))
    spec["capabilities"] = wanted

    # Weights: repository facts, pinned revision, where they live.
    repo = entry.get("weights")
    repo_facts = weights_repos.get(repo, {})
    revision = str(weights_revision or "").strip() or repo_facts.get("revision")
    base = posixpath.basename(str(repo))
    root = str(weights_root).rstrip("/") or "/"
    if not revision:
        blockers.append("no pinned weights revision for %s: set serving_weights_revision to the "
                        "40-hex commit you downloaded." % repo)
    elif not REVISION_RE.match(str(revision)):
        blockers.append("weights revision '%s' for %s is not a 40-hex commit: set "
                        "serving_weights_revision to the full commit sha." % (revision, repo))
    spec["weights"] = {
        "repo": repo, "revision": revision or None, "size_gb": repo_facts.get("size_gb"),
        "format": repo_facts.get("format"), "license": repo_facts.get("license"),
        "dir": posixpath.join(root, base),
        "container_dir": posixpath.join(CONTAINER_MODELS_ROOT, base),
        "manifest": posixpath.join(root, base + ".manifest.sha256"),
        "marker": posixpath.join(root, base + ".verified.json"),
    }

    # Engine: known, and the entry carries flags for it.
    entry_engines = entry.get("engines") or {}
    if engine not in engines:
        blockers.append("serving_engine '%s' is unknown; valid engines: %s."
                        % (engine, ", ".join(sorted(engines))))
        return spec
    if engine not in entry_engines:
        blockers.append("profile '%s' has no flags for engine '%s' (engines with flags for it: %s): "
                        "set serving_engine to one of them." % (profile, engine,
                                                                ", ".join(sorted(entry_engines))))
        return spec
    eng = entry_engines[engine]
    eng_facts = engines[engine]

    # Image: the entry's, merged with the site override; pinned by digest.
    img = merge(eng.get("image"), image)
    digest = img.get("digest")
    if digest and not DIGEST_RE.match(str(digest)):
        blockers.append("image digest '%s' is not 'sha256:<64 hex>': fix serving_image.digest."
                        % digest)
    elif not digest and not allow_unpinned_image:
        blockers.append("image %s has no digest (tag family %s): pin it with serving_image: "
                        "{digest: 'sha256:<64 hex>'} (its RepoDigests after a pull on the staging "
                        "host), or set serving_allow_unpinned_image: true for a lab."
                        % (img.get("repository"), img.get("tag_family") or img.get("tag") or "none"))
    spec["image"] = {"repository": img.get("repository"), "digest": digest or None,
                     "tag": img.get("tag") or img.get("tag_family"),
                     "local_id": bool(img.get("local_id")), "ref": image_ref(img),
                     "local_tag": image_local_tag(img)}

    # Network exposure.
    try:
        ipaddress.ip_address(str(bind_address).strip())
    except ValueError:
        if str(bind_address).strip().lower() != "localhost":
            blockers.append("serving_bind_address '%s' is not an IP address: set an address of "
                            "this node (127.0.0.1 keeps it on loopback)." % bind_address)
    if not is_loopback(bind_address) and not api_key_set:
        blockers.append("serving_bind_address %s is not loopback and serving_api_key is not set: "
                        "set serving_api_key (vaulted) or bind 127.0.0.1." % bind_address)
    host_port = _int_or_none(port)
    if not isinstance(host_port, int) or not 1 <= host_port <= 65535:
        blockers.append("serving_port %s is outside 1-65535: set a valid TCP port." % port)
    spec["port"] = host_port

    # Flags: the entry's, with the tuning presets applied (SGLang's troubleshooting knobs).
    args = [list(a) for a in eng.get("args") or []]
    if tuning and engine != "sglang":
        blockers.append("serving_tuning presets are SGLang flags; engine '%s' takes none: clear "
                        "serving_tuning." % engine)
    else:
        args, unknown = apply_presets(args, tuning_presets, tuning)
        for name in unknown:
            blockers.append("serving_tuning preset '%s' is unknown; valid presets: %s."
                            % (name, ", ".join(sorted(tuning_presets))))
    args_tp = tp_from_args(args)
    if args_tp is not None and args_tp != str(tp):
        blockers.append("profile '%s' has tp %s but its %s flags set %s: make them agree in "
                        "serving_profile_overrides." % (profile, tp, engine, args_tp))

    logged = [a[0] for a in args if a and a[0] in (eng_facts.get("request_logging_flags") or [])]
    if logged and not allow_request_logging:
        blockers.append("%s flags include %s, which logs prompts or outputs: remove it from "
                        "serving_profile_overrides, or set serving_allow_request_logging: true "
                        "where your data policy permits it." % (engine, ", ".join(logged)))

    container, container_blockers = container_settings(eng_facts, eng, engine)
    blockers.extend(container_blockers)

    cport = int(eng_facts.get("container_port"))
    command = list(eng_facts.get("command") or [])
    command += [eng_facts.get("model_arg"), spec["weights"]["container_dir"]]
    if eng_facts.get("served_model_name_arg"):
        # clients keep asking for the hub name although the model is loaded from a local path
        command += [eng_facts["served_model_name_arg"], str(repo)]
    command += flatten_args(args)
    command += ["--host", "0.0.0.0", "--port", str(cport)]
    spec.update(
        device_args=list(device_args.get(gpu["vendor"], [])),
        container_port=cport, health_path=eng_facts.get("health_path", "/health"),
        args=args, env={str(k): str(v) for k, v in (eng.get("env") or {}).items()},
        command=command, msa_warmup=bool(eng.get("msa_warmup", False)), container=container,
    )
    return spec


def serving_blockers_text(spec):
    """The refusal message: one blocker per line."""
    lines = ["serving: profile '%s' (%s) refused:" % (spec.get("profile"), spec.get("engine"))]
    lines += ["  - " + b for b in spec.get("blockers", [])]
    return "\n".join(lines)


class FilterModule(object):
    """serving_resolve, serving_blockers_text, serving_is_loopback."""

    def filters(self):
        return {
            "serving_resolve": serving_resolve,
            "serving_blockers_text": serving_blockers_text,
            "serving_is_loopback": is_loopback,
        }
