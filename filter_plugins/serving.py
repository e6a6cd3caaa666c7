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

import json
import posixpath
import re

from ansible.errors import AnsibleFilterError
from ansible.plugins.filter.core import combine
from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr
from ansible_collections.mm3.shared.plugins.module_utils import engine_args as ea
from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs
from ansible_collections.mm3.shared.plugins.module_utils import validation as v

KNOWN_CAPABILITIES = ("text", "reasoning", "tools", "image", "video")
# Flags that carry the tensor-parallel size (each engine's dest for them, through its recorded
# argument list, is what engine_flag_problems compares with the profile's tp).
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
    if not digest or image.get("local_id") or not v.is_image_id(digest):
        return None
    return dr.pinned_tag(image.get("repository"), digest)


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
                             or not PIDS_FLOOR <= pids <= 4194304):
        blockers.append("%s.pids_limit is %r: give a whole number of processes between %d (an engine "
                        "starts dozens of workers and threads) and 4194304 (or null for none)."
                        % (where, pids, PIDS_FLOOR))
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
            isinstance(name, str) and ENV_NAME_RE.fullmatch(name) and isinstance(value, str)
            and not v.has_control(value) for name, value in env.items()):
        blockers.append("%s.env is %r: give a mapping of variable names to one-line strings."
                        % (where, env))
    return settings, blockers


# Below this many processes and threads the engine cannot start its workers (the lab's one-rank CPU
# engine alone ran 75; a TP-8 GPU engine runs many more): a lower --pids-limit renders a unit that
# cannot serve.
PIDS_FLOOR = 512


def container_loosenings(reviewed, settings):
    """What `settings` loosens against the reviewed ones (the engine's and the matrix entry's):
    capabilities added or no longer all dropped, no-new-privileges off, a writable root, root
    instead of the reviewed user, a higher or no process limit. One line each, for the refusal
    and the plan."""
    loosened = []
    added = [c for c in settings["cap_add"] if c not in reviewed["cap_add"]]
    if added:
        loosened.append("adds capabilities %s" % ", ".join(added))
    if "ALL" in reviewed["cap_drop"] and "ALL" not in settings["cap_drop"]:
        loosened.append("no longer drops ALL capabilities")
    for key, what in (("no_new_privileges", "no-new-privileges off"), ("read_only", "a writable root")):
        if reviewed[key] is True and settings[key] is False:
            loosened.append(what)
    if reviewed["user"] is not None and settings["user"] is None:
        loosened.append("runs as the image's user (root) instead of %s" % reviewed["user"])
    if reviewed["pids_limit"] is not None and (settings["pids_limit"] is None
                                               or settings["pids_limit"] > reviewed["pids_limit"]):
        loosened.append("process limit %s instead of %s" % (settings["pids_limit"], reviewed["pids_limit"]))
    return loosened


def env_override_problems(entry_engine, container, engine_facts, engine):
    """Variables an entry or the site may not set because the project sets them for the node to
    work as reviewed: HF_HUB_OFFLINE=1 (the seed's offline start: docker keeps the last -e, so a
    later HF_HUB_OFFLINE=0 would let the engine call the hub) and the kernel cache's variables."""
    protected = {"HF_HUB_OFFLINE": "the node is offline (the seed's offline start)"}
    for name in ((engine_facts or {}).get("jit_cache") or {}).get("env") or {}:
        protected.setdefault(name, "the engine's kernel cache (serving_engines.%s.jit_cache)" % engine)
    cap_env = ((engine_facts or {}).get("output_cap") or {}).get("env")
    if cap_env:
        protected[cap_env] = "the engine's output cap: set serving_max_output_tokens"
    problems = []
    for where, env in (("env", (entry_engine or {}).get("env") or {}),
                       ("container.env", (container or {}).get("env") or {})):
        for name in sorted(set(env) & set(protected)) if isinstance(env, dict) else []:
            problems.append("serving_profile_overrides.engines.%s.%s sets %s, which the project sets "
                            "itself (%s): remove it." % (engine, where, name, protected[name]))
    return problems


def image_problems(image):
    """The image as docker will read it: a repository (never an option or a second token), a
    tag docker accepts."""
    problems = []
    repository = image.get("repository")
    if not v.is_image_repository(repository):
        problems.append("serving_image.repository %r is not an image repository as docker reads one "
                        "(lower-case path components, optionally after a registry host; no tag, digest, "
                        "space or option): fix serving_image.repository." % (repository,))
    for key in ("tag", "tag_family"):
        if image.get(key) not in (None, "") and not v.is_image_tag(image.get(key)):
            problems.append("serving_image.%s %r is not a tag docker accepts (letters, digits, '_', '.', "
                            "'-'; at most 128): fix it." % (key, image.get(key)))
    return problems


def api_key_problem(key, defined=True):
    """Why `serving_api_key` cannot be used as a key, or None (unset is fine: loopback only).
    Never echoes the key."""
    if not defined:
        return None
    fix = ("set serving_api_key to a random string of at least %d characters (openssl rand -hex 32), "
           "vaulted, or remove the variable to serve on loopback without a key" % v.SECRET_MIN_LENGTH)
    if key is None:
        return "serving_api_key is set but null (SGLang would read the key \"None\"): " + fix + "."
    return v.secret_problem(key, "serving_api_key", fix)


def bind_address_problem(address):
    """Why serving_bind_address cannot be published by `docker run -p`, or None."""
    if not isinstance(address, str):
        return ("serving_bind_address is %r (%s): set an IP address of this node, e.g. 127.0.0.1."
                % (address, v.type_name(address)))
    if address.strip().lower() == "localhost":
        return ("serving_bind_address is 'localhost', which docker -p does not accept: set "
                "127.0.0.1 (or ::1).")
    return v.bind_address_problem(address, "serving_bind_address")


def media_domains_problems(domains):
    """(host names, blockers) for serving_media_domains: a list of plain host names."""
    if domains in (None, ""):
        return [], []
    if not isinstance(domains, list):
        return [], ["serving_media_domains is a %s: list host names (e.g. the gateway's "
                    "gateway_media_allowlist)." % v.type_name(domains)]
    good, blockers = [], []
    for item in domains:
        host = str(item).strip().lower().rstrip(".")
        if not isinstance(item, str) or not v.is_hostname(host):
            blockers.append("serving_media_domains entry %r is not a host name: write it as "
                            "images.intranet (no scheme, port or path)." % (item,))
        else:
            good.append(host)
    return sorted(set(good)), blockers


def weights_layout(root, repo, revision):
    """Where one revision of a weights repository lives under serving_weights_root.

    One directory per revision, `<root>/<org>/<name>/<revision>/`, with its manifest, verified
    marker and provenance record beside it (`<revision>.manifest.sha256`, ...: never inside the
    directory the engine mounts), and two links in the repository directory that weights_sync
    keeps: `current` (the newest verified revision, switched by weights_sync), `serving` (the
    revision the engine answers on) and `previous` (what `serving` named before), both kept by
    model_server. The unit mounts the revision directory itself, never a link, so a switch
    cannot change what a running or restarting engine reads.
    """
    repo_dir = posixpath.join(root, *str(repo).split("/"))
    rev = str(revision) if revision else "UNPINNED"
    rev_dir = posixpath.join(repo_dir, rev)
    return {
        "root": root, "repo_dir": repo_dir, "dir": rev_dir,
        "manifest": rev_dir + ".manifest.sha256",
        "marker": rev_dir + ".verified.json",
        "current": posixpath.join(repo_dir, "current"),
        "serving": posixpath.join(repo_dir, "serving"),
        "previous": posixpath.join(repo_dir, "previous"),
    }


def type_problems(inputs):
    """One blocker per operator input given with the wrong type ({name: (value, type)}):
    a list given as a string would otherwise be read character by character."""
    names = {list: "a list", dict: "a mapping", str: "a string"}
    problems = []
    for name, (value, wanted) in inputs.items():
        if value is None or isinstance(value, wanted):
            continue
        example = {list: " (e.g. [%s])" % value if isinstance(value, str) else "",
                   dict: "", str: ""}[wanted]
        problems.append("%s is %s (%r): give %s%s." % (name, v.type_name(value), value,
                                                       names[wanted], example))
    return problems


def preset_conflicts(presets, names):
    """Blockers for tuning presets that set one flag to different values ([oom_step3,
    long_context] would silently undo the memory fix)."""
    seen = {}
    problems = []
    for name in names or []:
        for flag, value in (presets.get(name) or {}).items():
            if flag in seen and str(seen[flag][1]) != str(value):
                problems.append("serving_tuning presets '%s' and '%s' set %s to %s and %s: keep "
                                "one of them." % (seen[flag][0], name, flag, seen[flag][1], value))
            seen.setdefault(flag, (name, value))
    return problems


def args_problem(args, where):
    """Why an engine's args are not a list of [flag, value?] lists of scalars, or None."""
    if not isinstance(args, list) or not all(
            isinstance(arg, list) and 1 <= len(arg) <= 2 and isinstance(arg[0], str)
            and arg[0].startswith("-") and all(isinstance(t, (str, int, float)) and
                                               not isinstance(t, bool) for t in arg)
            for arg in args):
        return ("%s is %r: give a list of [flag, value] or [flag] lists, e.g. "
                "[[--mem-fraction-static, \"0.60\"]]." % (where, args))
    return None


def range_problem(rule, engine, flag, value):
    """Why `value` of a numeric flag is outside its range (serving_flag_ranges), or None."""
    text = str(value).strip()
    try:
        number = int(text) if rule.get("type") == "int" else float(text)
    except ValueError:
        number = None
    allowed = [str(a) for a in rule.get("allow", [])]
    if number is not None and (text in allowed or (
            ("gt" not in rule or number > rule["gt"]) and ("ge" not in rule or number >= rule["ge"])
            and ("lt" not in rule or number < rule["lt"]) and ("le" not in rule or number <= rule["le"]))):
        return None
    bounds = ", ".join("%s %s" % (op, rule[key]) for key, op in
                       (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if key in rule)
    return ("%s %s is %s: it must be %s%s%s; fix it in serving_profile_overrides or serving_tuning."
            % (engine, flag, value, "an integer" if rule.get("type") == "int" else "a number",
               " " + bounds if bounds else "", " (or %s)" % ", ".join(allowed) if allowed else ""))


# Where a flag of the resolved list came from: the project's own tokens (the engine's command, the
# verified model path, the served name, the metrics switch, host and port).
PROJECT_ORIGIN = "the project's own command"


def arg_origins(engine, profile, args, site_args, presets, tuning):
    """The variable each resolved [flag, value] comes from: the site's override list when it gave
    one, else the matrix entry; a flag a tuning preset appended, that preset."""
    listed = {a[0] for a in site_args[1] or []}
    where = site_args[0] or "serving_matrix.%s.engines.%s.args" % (profile, engine)
    origins = []
    for arg in args:
        origin = where
        if arg[0] not in listed:
            origin = next(("serving_tuning preset %s (serving_tuning_presets)" % name for name in tuning or []
                           if arg[0] in (presets.get(name) or {})), PROJECT_ORIGIN)
        origins.append(origin)
    return origins


def engine_flag_problems(ctx, record, command, args_at, args, origins, base_args):
    """The resolved command read the way the engine's argparse reads it (engine_args over the
    engine's recorded argument list, serving_engines.<engine>.argparse): one blocker per unknown
    option, abbreviation, ambiguous prefix, repeated option (any form), missing or stray value;
    per flag the site may not set (what the project sets itself, and argparse.protected: the API
    key and the config file, in any form); per reviewed flag an override dropped; per number out of
    serving_flag_ranges; a TP value that disagrees with the profile's; request logging switched on.
    `ctx`: engine, profile, tp, facts (serving_engines.<engine>), ranges, capabilities, allow_logging.
    """
    engine, profile, facts = ctx["engine"], ctx["profile"], ctx["facts"]
    settings = facts.get("argparse") or {}
    if not record:
        return ["engine '%s' has no recorded argument list: record it (tools/engine_args/record_image.sh) "
                "and name the file in serving_engines.%s.argparse.file." % (engine, engine)]
    tab = ea.table(record)
    accepted = settings.get("abbreviations") or []
    skip = len(record.get("command") or [])
    flat = flatten_args(args)
    token_origins = []
    for index in range(skip, len(command)):
        inside = args_at <= index < args_at + len(flat)
        token_origins.append(origins[_arg_index(args, index - args_at)] if inside else PROJECT_ORIGIN)
    occurrences, problems = ea.canonicalize(command[skip:], tab, token_origins, accepted)

    def dest(flag):
        return ea.dest_of(flag, tab, accepted)

    owned = {o["dest"] for o in occurrences if o["origin"] == PROJECT_ORIGIN and o["option"]}
    owned |= {dest(flag) for flag in settings.get("protected") or []} - {None}
    blockers = []
    for problem in problems:
        if problem["kind"] == "duplicate" and problem["origin"] != PROJECT_ORIGIN and any(
                o["token"] == problem["token"] and o["dest"] in owned for o in occurrences):
            continue  # the flag is refused below as the project's own
        fix = (" (record the argument list of the engine image you run with tools/engine_args/record_image.sh "
               "and name it in serving_engines.%s.argparse.file)" % engine) if problem["origin"] == PROJECT_ORIGIN \
            else ""
        blockers.append("%s flags in %s: %s%s." % (engine, problem["origin"], problem["message"], fix))
    cap_flag = (facts.get("output_cap") or {}).get("flag")
    cap_dest = dest(cap_flag) if cap_flag else None
    for occ in occurrences:
        if occ["option"] and occ["origin"] != PROJECT_ORIGIN and occ["dest"] in owned:
            blockers.append("%s sets %s, which the project sets itself: remove it%s." % (
                occ["origin"], occ["flag"] if occ["flag"] == occ["option"] else "%s (%s)" % (occ["flag"], occ["option"]),
                " and set serving_api_key (vaulted): the engine reads the key from its config file, never "
                "from argv, the unit or the plan" if occ["dest"] == dest("--api-key") else
                " (it carries the engine's output cap: set serving_max_output_tokens; other generation "
                "defaults belong in the model's generation_config.json)"
                if cap_dest and occ["dest"] == cap_dest else
                " (the model is the verified weights, host and port come from serving_bind_address and "
                "serving_port)"))
    required = list((facts.get("required_flags") or {}).get("always", []))
    for cap in ctx["capabilities"] or []:
        required += (facts.get("required_flags") or {}).get(cap, [])
    present = {o["dest"] for o in occurrences if o["option"]}
    for arg in base_args:
        if arg[0] in required and dest(arg[0]) not in present:
            blockers.append("%s flag %s of profile '%s' is missing from the resolved flags (an override "
                            "replaced the list): an override may change it, never drop it; add it back "
                            "to serving_profile_overrides.engines.%s.args." % (engine, arg[0], profile, engine))
    ranges = {dest(flag): rule for flag, rule in (ctx["ranges"] or {}).items()}
    tp_dests = {dest(flag) for flag in TP_FLAGS} - {None}
    logging = {dest(flag) for flag in facts.get("request_logging_flags") or []} - {None}
    logged = []
    for occ in occurrences:
        if not occ["option"] or not occ["values"] and occ["dest"] not in logging:
            continue
        if occ["dest"] in ranges and occ["values"]:
            problem = range_problem(ranges[occ["dest"]], engine, occ["flag"], occ["values"][-1])
            if problem:
                blockers.append(problem)
        if occ["dest"] in tp_dests and occ["values"] and _int_or_none(occ["values"][-1]) != ctx["tp"]:
            blockers.append("profile '%s' has tp %s but its %s flags set %s: make them agree in "
                            "serving_profile_overrides." % (profile, ctx["tp"], engine, occ["values"][-1]))
        if occ["dest"] in logging and occ["value"] not in (False, None, "None", [], ""):
            logged.append(occ["flag"])
    if logged and not ctx["allow_logging"]:
        blockers.append("%s flags include %s, which logs prompts or outputs: remove it from "
                        "serving_profile_overrides, or set serving_allow_request_logging: true "
                        "where your data policy permits it." % (engine, ", ".join(logged)))
    return blockers


def _arg_index(args, offset):
    """Which [flag, value] of `args` holds the token at `offset` in flatten_args(args)."""
    for index, arg in enumerate(args):
        if offset < len(arg):
            return index
        offset -= len(arg)
    return len(args) - 1


def arg_sources(base_args, args, presets, tuning, source):
    """["flag value", source] per resolved flag: the entry's source (seed, cookbook, recipe, lab), a
    tuning preset that set it, or the site's override when it differs from the matrix."""
    base = {arg[0]: [str(t) for t in arg[1:]] for arg in base_args}
    result = []
    for arg in args:
        origin = source
        for name in tuning or []:
            if arg[0] in (presets.get(name) or {}):
                origin = "tuning preset " + name
        if origin == source and (arg[0] not in base or base[arg[0]] != [str(t) for t in arg[1:]]):
            origin = "site override (serving_profile_overrides)"
        result.append([" ".join(str(t) for t in arg), origin])
    return result


def secret_free(sources, args, record):
    """arg_sources with the value of any flag that sets the engine's API key (in any form the
    engine reads: --api-key K, --api-key=K, a prefix) replaced by <redacted>: such a flag is
    refused, and the plan that says so must not print the key."""
    if not record:
        return sources
    tab = ea.table(record)
    secret = ea.dest_of("--api-key", tab)
    result = []
    for (text, origin), arg in zip(sources, args):
        tokens = [str(token) for token in arg]
        occurrences, _ = ea.canonicalize(tokens, tab, [origin] * len(tokens), ())
        if secret and any(o.get("dest") == secret for o in occurrences):
            text = tokens[0].split("=", 1)[0] + " <redacted>"
        result.append([text, origin])
    return result


def output_cap(value, engine_facts, engine):
    """The engine's own cap on the tokens one request generates (serving_max_output_tokens, read
    through serving_engines.<engine>.output_cap): ({tokens, flag, env, args}, problems). `args`
    are the command tokens ([flag, JSON] for vLLM's --override-generation-config); `env` the
    variable the engine reads instead (SGLang's SGLANG_MAX_NEW_TOKENS_LIMIT). An engine without an
    output_cap entry gets no cap (tokens None)."""
    facts = (engine_facts or {}).get("output_cap") or {}
    cap = {"tokens": None, "flag": facts.get("flag"), "env": facts.get("env"), "args": []}
    tokens = v.whole_number(value, *v.OUTPUT_TOKENS_RANGE)
    if tokens is None:
        return dict(cap, flag=None, env=None), [
            "serving_max_output_tokens is %r: give a whole number from %d to %d (the most tokens the engine "
            "generates for one request)." % (value, v.OUTPUT_TOKENS_RANGE[0], v.OUTPUT_TOKENS_RANGE[1])]
    if facts:
        cap["tokens"] = tokens
    if facts.get("flag"):
        value = json.dumps({facts["json_key"]: tokens}, separators=(",", ":")) if facts.get("json_key") else str(tokens)
        cap["args"] = [facts["flag"], value]
    return cap, []


def command_sources(engine_facts, engine, model_dir, repo, container_port, cap=None):
    """["tokens", source] for each part of the engine command that is not a profile flag (those
    are arg_sources): the engine's command, the model path, the served name, the metrics switch,
    the address and port inside the container. The plan prints them with the flags."""
    where = "serving_engines.%s" % engine
    model = [engine_facts["model_arg"], model_dir] if engine_facts.get("model_arg") else [model_dir]
    result = [[" ".join(engine_facts.get("command") or []), "engine: %s.command" % where],
              [" ".join(model), "project: the verified weights, mounted read-only (the seed's offline start)"]]
    if engine_facts.get("served_model_name_arg"):
        result.append(["%s %s" % (engine_facts["served_model_name_arg"], repo),
                       "project: clients ask for the hub name (%s.served_model_name_arg)" % where])
    if engine_facts.get("metrics_args"):
        result.append([" ".join(engine_facts["metrics_args"]),
                       "project: /metrics for monitoring (%s.metrics_args)" % where])
    if (cap or {}).get("args"):
        result.append([" ".join(cap["args"]), "project: the engine's own output cap (serving_max_output_tokens, "
                       "%s.output_cap)" % where])
    result.append(["--host 0.0.0.0 --port %s" % container_port,
                   "seed: every address inside the container, published on serving_bind_address only"])
    return result


def manifest_pin_for(inventory_pin, repo_facts, revision, inventory_revision):
    """The pinned sha256 of the weights manifest, and a blocker or None.

    The inventory's serving_weights_manifest_sha256 wins; the matrix's value
    (serving_weights_repos.<repo>.manifest_sha256) holds only for the matrix's own revision,
    never for a revision the inventory chose. Unpinned (None) is not a blocker here: the
    staging run prints the hash for review and every node refuses to verify against nothing.
    """
    value = str(inventory_pin or "").strip()
    if not value:
        same_revision = not str(inventory_revision or "").strip() or revision == repo_facts.get("revision")
        value = str(repo_facts.get("manifest_sha256") or "").strip() if same_revision else ""
    if not value:
        return None, None
    if not v.is_sha256(value):
        return None, ("serving_weights_manifest_sha256 %r is not a sha256 (64 lowercase hex): copy "
                      "the value the staging run printed for review." % value)
    return value, None


# What serving_resolve reads: the site's choices (`inputs`, each the serving_<name> variable of
# the role's defaults, which are the one home of their default values) and the hardware matrix
# with its tables (`tables`, roles/serving/vars/main.yml).
INPUTS = ("profile", "engine", "allow_inferred", "bind_address", "port", "api_key", "api_key_defined",
          "image", "allow_unpinned_image", "weights_revision", "weights_manifest_sha256", "weights_root",
          "profile_overrides", "tuning", "capabilities", "gpu_count", "allow_request_logging", "gateway",
          "media_domains", "allow_container_privileges", "host", "imex_domain", "imex_domain_members",
          "max_output_tokens", "release_bundle", "release_keys", "release_revoked", "release_today",
          "gateway_policy")
TABLES = ("matrix", "weights_repos", "engines", "device_args", "tuning_presets", "flag_ranges", "flag_sources",
          "engine_args", "vendor_container_notes")


def imex_domain(gpu, matrix, host, domain, members, blockers):
    """The IMEX domain of a GB-series tray (profile fabric imex): {group, hosts}. A tray names its
    NVLink domain with serving_imex_domain, the inventory group holding exactly the trays of that
    domain (members: {host: its serving_profile} of that group, None when no such group exists);
    unset, the tray is a domain of its own (a single-tray profile needs no other tray). Refused,
    into blockers: a domain on a profile without IMEX, a group that does not exist, a tray outside
    its own group, and a member whose profile has no IMEX fabric (an H200 in a GB200 rack).
    None for profiles without IMEX."""
    named = None if domain in (None, "") else domain
    if gpu.get("fabric") != "imex":
        if named is not None:
            blockers.append("serving_imex_domain is %r but this profile's GPUs (%s) have no IMEX domain: "
                            "unset serving_imex_domain for this node (only GB-series trays join one)."
                            % (named, gpu.get("model")))
        return None
    if named is None:
        return {"group": None, "hosts": [host] if host else []}
    if not isinstance(named, str) or not v.is_word(named):
        blockers.append("serving_imex_domain must be the name of the inventory group holding the trays of this "
                        "node's NVLink domain, not %r." % (named,))
        return {"group": None, "hosts": [host] if host else []}
    if not isinstance(members, dict):
        blockers.append("serving_imex_domain names group '%s', which the inventory does not have: put the trays "
                        "of this NVLink domain in that group (one group per domain)." % named)
        return {"group": named, "hosts": [host] if host else []}
    hosts = list(members)
    if host and host not in hosts:
        blockers.append("serving_imex_domain names group '%s', which does not hold %s: a tray's domain group must "
                        "hold the tray itself (set serving_imex_domain in that group's group_vars)." % (named, host))
    foreign = ["%s (%s)" % (member, profile) for member, profile in members.items()
               if ((matrix.get(profile) or {}).get("gpu") or {}).get("fabric") != "imex"]
    if foreign:
        blockers.append("IMEX domain '%s' holds %s, whose profile has no IMEX fabric: a domain group holds only "
                        "the GB-series trays of one NVLink domain; move the others out of it."
                        % (named, ", ".join(sorted(foreign))))
    return {"group": named, "hosts": hosts}


def serving_resolve(inputs, tables):
    """Resolve the site's choices (`inputs`, keys INPUTS) against the hardware matrix (`tables`,
    keys TABLES) into serving_spec. Never raises for bad input: every problem becomes one line in
    spec['blockers'], each naming the fix. The API key itself is only checked (api_key_problem),
    never stored in the spec. An unknown key in either mapping is a programming error (a typo
    would silently resolve with a default) and raises."""
    unknown = sorted(set(inputs or {}) - set(INPUTS)) + sorted(set(tables or {}) - set(TABLES))
    if unknown:
        raise AnsibleFilterError("serving_resolve: unknown keys %s (inputs: %s; tables: %s)"
                                 % (", ".join(unknown), ", ".join(INPUTS), ", ".join(TABLES)))
    get = dict(dict.fromkeys(INPUTS), **(inputs or {})).get
    table = dict(dict.fromkeys(TABLES), **(tables or {})).get
    matrix = table("matrix") or {}
    weights_repos = table("weights_repos") or {}
    engines = table("engines") or {}
    device_args = table("device_args") or {}
    tuning_presets = table("tuning_presets") or {}
    flag_ranges, flag_sources = table("flag_ranges"), table("flag_sources")
    engine, bind_address, port = get("engine"), get("bind_address"), get("port")
    api_key, api_key_defined = get("api_key"), get("api_key_defined") is True
    image, weights_revision, weights_root = get("image"), get("weights_revision"), get("weights_root")
    weights_manifest_sha256, gpu_count = get("weights_manifest_sha256"), get("gpu_count")
    profile_overrides, tuning, capabilities = get("profile_overrides"), get("tuning"), get("capabilities")
    allow_inferred, allow_unpinned_image = get("allow_inferred") is True, get("allow_unpinned_image") is True
    allow_request_logging, gateway = get("allow_request_logging") is True, get("gateway")
    media_domains = get("media_domains")
    allow_container_privileges = get("allow_container_privileges") is True
    blockers = []
    profiles = sorted(matrix)
    profile = str(get("profile") or "").strip()
    # A signed release gives the pins the inventory leaves unset (the weights revision, the image
    # digest; the manifest pin below), before the matrix's defaults: rollout.yml then takes a
    # release in place of the separate pins. A pin the inventory sets wins and must equal the
    # signed one; release_check binds the whole release at the end.
    verified, release_problems = release_verify(get("release_bundle"), get("release_keys"), get("release_revoked"),
                                                get("release_today"))
    signed = release_pins(verified)
    if not str(weights_revision or "").strip() and signed.get("revision"):
        weights_revision = signed["revision"]
    if signed.get("image") and (image is None or isinstance(image, dict)) and not (image or {}).get("digest"):
        image = dict(signed["image"], **{k: item for k, item in (image or {}).items() if item not in (None, "")})

    # Inputs of the wrong type are refused once each, then treated as empty.
    typed = type_problems({"serving_tuning": (tuning, list),
                           "serving_capabilities": (capabilities, list),
                           "serving_profile_overrides": (profile_overrides, dict),
                           "serving_image": (image, dict),
                           "serving_engine": (engine, str)})
    blockers.extend(typed)
    tuning = tuning if isinstance(tuning, list) else []
    capabilities = capabilities if isinstance(capabilities, list) else []
    profile_overrides = profile_overrides if isinstance(profile_overrides, dict) else {}
    image = image if isinstance(image, dict) else {}
    engine = engine if isinstance(engine, str) else ""

    key_problem = api_key_problem(api_key, api_key_defined)
    if key_problem:
        blockers.append(key_problem)
    api_key_set = api_key_defined and key_problem is None
    gateway = gateway is True
    if gateway and api_key_defined:
        # SGLang prints its server_args, key included, on every start: behind the gateway the
        # engine gets no key at all, so no engine can log one.
        blockers.append("serving_api_key is set while serving_gateway is true: the engine behind the "
                        "gateway gets no key (SGLang would log it); remove serving_api_key and give "
                        "each client its own key in gateway_clients.")

    spec = {
        "profile": profile, "description": None, "status": None, "engine": engine,
        "gpu": {}, "tp": None, "capabilities": [], "weights": {}, "image": {},
        "device_args": [], "bind_address": bind_address, "port": None, "container_port": None,
        "health_path": None, "args": [], "arg_sources": [], "source": None, "env": {},
        "entrypoint": [], "command": [], "command_sources": [], "served_model_name": None, "msa_warmup": False, "jit_cache": {},
        "auth": bool(api_key_set), "gateway": gateway, "tuning": list(tuning), "container": {},
        "container_loosened": [], "container_notes": [], "imex": None, "max_output_tokens": None,
        "output_cap": {}, "release": None, "release_refusal": [], "release_bundle": None, "release_trust": None,
        "blockers": blockers,
    }

    if profile not in matrix:
        what = "is not set" if not profile else "'%s' is not in the hardware matrix" % profile
        blockers.append("serving_profile %s; valid profiles: %s. Set serving_profile to one of them."
                        % (what, ", ".join(profiles)))
        return spec

    entry = merge(matrix[profile], profile_overrides)
    gpu = dict({"vendor": None, "model": None, "count": 0,
                "driver_floor": None, "rocm_floor": None, "rocm_default": None, "fabric": None}, **entry.get("gpu", {}))
    tp = _int_or_none(entry.get("tp"))
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        blockers.append("profile '%s' has tp %r: set serving_profile_overrides.tp to a whole number "
                        ">= 1." % (profile, entry.get("tp")))
        tp = 0
    spec.update(description=entry.get("description"), status=entry.get("status"), gpu=gpu, tp=tp)

    spec["imex"] = imex_domain(gpu, matrix, get("host"), get("imex_domain"), get("imex_domain_members"), blockers)

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
    if repo not in weights_repos:
        blockers.append("weights repository %r of profile '%s' is not one of the matrix's "
                        "(serving_weights_repos: %s): set serving_profile_overrides.weights to one of them."
                        % (repo, profile, ", ".join(sorted(weights_repos))))
    repo_facts = weights_repos.get(repo, {})
    revision = str(weights_revision or "").strip() or repo_facts.get("revision")
    base = posixpath.basename(str(repo))
    root_problem = v.absolute_path_problem(weights_root, "serving_weights_root")
    if root_problem:
        blockers.append(root_problem)
    root = str(weights_root).rstrip("/") or "/"
    if not revision:
        blockers.append("no pinned weights revision for %s: set serving_weights_revision to the "
                        "40-hex commit you downloaded." % repo)
    elif not v.is_git_commit(str(revision)):
        blockers.append("weights revision '%s' for %s is not a 40-hex commit: set "
                        "serving_weights_revision to the full commit sha." % (revision, repo))
    manifest_pin, pin_problem = manifest_pin_for(weights_manifest_sha256, repo_facts,
                                                 revision, weights_revision)
    if pin_problem:
        blockers.append(pin_problem)
    spec["weights"] = weights_layout(root, repo, revision)
    spec["weights"].update({
        "repo": repo, "revision": revision or None, "manifest_sha256": manifest_pin, "size_gb": repo_facts.get("size_gb"),
        "format": repo_facts.get("format"), "license": repo_facts.get("license"),
        "container_dir": posixpath.join(CONTAINER_MODELS_ROOT, base),
    })

    # Network exposure: an IP literal docker -p accepts, a port, a key off loopback.
    address_problem = bind_address_problem(bind_address)
    if address_problem:
        blockers.append(address_problem)
    elif gateway and not v.is_loopback(bind_address):
        blockers.append("serving_bind_address %s is not loopback while serving_gateway is true: set "
                        "serving_bind_address: 127.0.0.1 (only the gateway may reach the engine)."
                        % bind_address)
    elif not v.is_loopback(bind_address) and not api_key_set:
        blockers.append("serving_bind_address %s is not loopback and serving_api_key is not set: "
                        "set serving_api_key (vaulted) or bind 127.0.0.1." % bind_address)
    host_port, problem = v.port_problem(port, "serving_port")
    if problem:
        blockers.append(problem)
    spec["port"] = host_port

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
    blockers.extend(image_problems(img))
    digest = img.get("digest")
    if digest and not v.is_image_id(digest):
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

    # Flags: the entry's (an override may replace the list: it must stay well-formed and keep
    # what the matrix requires), with the tuning presets applied (SGLang's troubleshooting knobs).
    base_args = [list(a) for a in ((matrix[profile].get("engines") or {}).get(engine) or {}).get("args") or []]
    problem = args_problem(eng.get("args") or [], "serving_profile_overrides.engines.%s.args" % engine)
    if problem:
        blockers.append(problem)
        args = base_args
    else:
        args = [list(a) for a in eng.get("args") or []]
    if tuning and engine != "sglang":
        blockers.append("serving_tuning presets are SGLang flags; engine '%s' takes none: clear "
                        "serving_tuning." % engine)
    else:
        blockers.extend(preset_conflicts(tuning_presets, tuning))
        args, unknown = apply_presets(args, tuning_presets, tuning)
        for name in unknown:
            blockers.append("serving_tuning preset '%s' is unknown; valid presets: %s."
                            % (name, ", ".join(sorted(tuning_presets))))
    site_args = (("serving_profile_overrides.engines.%s.args" % engine, eng.get("args"))
                 if not problem and "args" in ((profile_overrides.get("engines") or {}).get(engine) or {})
                 else (None, base_args))
    origins = arg_origins(engine, profile, args, site_args, tuning_presets, tuning)

    # The engine's own media-domain switch, where it has one (vLLM --allowed-media-domains),
    # set to the gateway's allowlist: a second guard behind the gateway's. An empty list is not
    # passed on: for vLLM it would mean "any domain"; the gateway then refuses every URL.
    domains, domain_problems = media_domains_problems(media_domains)
    blockers.extend(domain_problems)
    media_flag = eng_facts.get("media_domains_flag")
    if domains and media_flag:
        kept = [i for i, a in enumerate(args) if a and a[0] != media_flag]
        args = [args[i] for i in kept] + [[media_flag] + domains]
        origins = [origins[i] for i in kept] + [PROJECT_ORIGIN]

    container, container_blockers = container_settings(eng_facts, eng, engine)
    blockers.extend(container_blockers)
    # What the site's overrides loosen in the engine's reviewed least privilege (the engine's and
    # the matrix entry's settings): refused unless acknowledged, and listed in the plan either way.
    reviewed, _ = container_settings(eng_facts, ((matrix[profile].get("engines") or {}).get(engine) or {}), engine)
    loosened = container_loosenings(reviewed, container) if not container_blockers else []
    if loosened and not allow_container_privileges:
        blockers.append("serving_profile_overrides.engines.%s.container loosens the engine container's "
                        "reviewed least privilege (%s): remove it, or set serving_allow_container_privileges: "
                        "true to accept it (the plan prints it)." % (engine, "; ".join(loosened)))
    blockers.extend(env_override_problems(eng, container, eng_facts, engine))

    cport = int(eng_facts.get("container_port"))
    command = list(eng_facts.get("command") or [])
    if eng_facts.get("model_arg"):
        command += [eng_facts["model_arg"]]
    command += [spec["weights"]["container_dir"]]  # no model_arg: positional (vllm serve MODEL)
    # The name /v1/models lists (the verify playbook requires it): the hub name where the
    # engine is told it; otherwise the engine's own default, the model path (SGLang
    # ServerArgs: served_model_name = model_path when unset).
    served_model_name = spec["weights"]["container_dir"]
    if eng_facts.get("served_model_name_arg"):
        # clients keep asking for the hub name although the model is loaded from a local path
        command += [eng_facts["served_model_name_arg"], str(repo)]
        served_model_name = str(repo)
    args_at = len(command)
    command += flatten_args(args)
    # What makes the engine serve /metrics (monitoring), after the profile's own flags.
    command += [str(a) for a in eng_facts.get("metrics_args") or [] if a not in command]
    # The engine's own output cap (a flag, or a variable below), the second line behind the gateway's.
    cap, cap_problems = output_cap(get("max_output_tokens"), eng_facts, engine)
    blockers.extend(cap_problems)
    command += cap["args"]
    command += ["--host", "0.0.0.0", "--port", str(cport)]
    # Every flag of that command as the engine's argparse reads it (engine_flag_problems).
    blockers.extend(engine_flag_problems(
        {"engine": engine, "profile": profile, "tp": tp, "facts": eng_facts, "ranges": flag_ranges,
         "capabilities": wanted, "allow_logging": allow_request_logging},
        (table("engine_args") or {}).get(engine), command, args_at, args, origins, base_args))
    msa = eng.get("msa_warmup", False)
    if not isinstance(msa, bool):
        blockers.append("msa_warmup is %r: set true or false." % (msa,))
    source = eng.get("source") or "matrix"
    spec.update(
        device_args=list(device_args.get(gpu["vendor"], [])),
        container_port=cport, health_path=eng_facts.get("health_path", "/health"),
        args=args, env=dict({str(name): str(value) for name, value in (eng.get("env") or {}).items()},
                            **({cap["env"]: str(cap["tokens"])} if cap["env"] and cap["tokens"] else {})),
        max_output_tokens=cap["tokens"],
        output_cap={"flag": cap["flag"], "env": cap["env"]},
        entrypoint=[str(t) for t in eng_facts.get("image_entrypoint") or []],
        served_model_name=served_model_name,
        command=command, msa_warmup=msa is True, container=container, container_loosened=loosened,
        # the kernel caches, for every profile (model_server mounts them per image digest)
        jit_cache=dict(eng_facts.get("jit_cache") or {}),
        source=(flag_sources or {}).get(source, source),
        arg_sources=secret_free(arg_sources(base_args, args, tuning_presets, tuning, source), args,
                                (table("engine_args") or {}).get(engine)),
        command_sources=command_sources(eng_facts, engine, spec["weights"]["container_dir"], repo, cport, cap),
        # what the vendor's own container instructions add and why the project does not (the plan prints it)
        container_notes=list((table("vendor_container_notes") or {}).get(gpu["vendor"]) or []),
    )
    # What the gateway in front lets clients do (filter gateway_policy of the gateway role's
    # inputs), which a release binds; None without a gateway.
    spec["gateway_policy"] = get("gateway_policy") if spec.get("gateway") else None
    # The signed release, where release keys are listed: it must be what this spec runs, and it
    # gives the manifest pin when the inventory sets none.
    release, differ = release_check(spec, verified) if verified else (None, [])
    release_problems = release_problems + differ
    blockers.extend(release_problems)
    spec["release"] = release
    spec["release_refusal"] = list(release_problems)
    # What the node's own start check reads (role model_server): the verified bundle, and the
    # keys and revocations it is checked against, whenever keys are listed and well-formed
    # (playbooks/release-trust.yml writes them even while a revoked release is refused).
    spec["release_bundle"] = (str(get("release_bundle")).rstrip("\n") + "\n") if release else None
    spec["release_trust"] = release_trust(get("release_keys"), get("release_revoked"))
    if release and not spec["weights"].get("manifest_sha256"):
        spec["weights"]["manifest_sha256"] = release["manifest_sha256"]
    # The central check: nothing that reaches the unit or argv holds a control character.
    # (The bundle and the trust file are JSON files on the node, never in the unit or argv: the
    # bundle verified, every key parsed.)
    blockers.extend(v.control_problems({k: item for k, item in spec.items()
                                        if k not in ("blockers", "release_bundle", "release_trust")}, "serving"))
    return spec


# --- Signed releases (issue 33): the release part the plan writes, and its check -----------------

# What a release binds, in the order a refusal names the parts that differ.
RELEASE_PARTS = ("repo", "revision", "manifest_sha256", "profile", "engine", "images", "argv", "env", "container",
                 "gateway_policy")


def release_part(spec, eval_set=None):
    """The project's part of a release document (predicate.mm3_release) for serving_spec: the
    weights (repository, revision, manifest sha256), the profile and engine, the image, and the
    engine's exact argv and environment as the unit runs them (engine_env: the entry's and the
    container's, with HF_HUB_OFFLINE), the container's device and least-privilege options as the
    unit renders them (container: docker_run.container_options), what the gateway in front lets
    clients do (gateway_policy,
    None without a gateway), and the evaluation set verify.yml judges the release by (eval_set:
    release_eval_set of it, which role serving_verify reads; checked there, not here).
    plan.yml writes it for review; tools/release_sign.py signs it together with the manifest's
    files."""
    spec = spec or {}
    weights = spec.get("weights") or {}
    return {"repo": weights.get("repo"), "revision": weights.get("revision"),
            "manifest_sha256": weights.get("manifest_sha256"), "profile": spec.get("profile"),
            "engine": spec.get("engine"), "images": [(spec.get("image") or {}).get("ref")],
            "argv": [str(t) for t in spec.get("command") or []],
            "env": ["%s=%s" % pair for pair in ea.engine_env(spec)], "container": dr.container_options(spec),
            "gateway_policy": spec.get("gateway_policy"),
            "eval_set": eval_set}


def release_verify(bundle, keys, revoked, today):
    """Verify the signed release (`bundle`, the text of its .sig) against `keys` (release_keys) less
    `revoked` on `today` (YYYY-MM-DD), once per resolve: (rs.verify's result or None, blockers).
    Without keys and bundle: (None, []) and the manifest pin alone is the anchor."""
    keys = keys or []
    revoked = revoked or []
    if not keys and not bundle:
        return None, []
    if not keys:
        return None, ["serving_release_bundle is set but serving_release_keys is empty: list the public keys "
                      "that may sign releases (docs/operations/releases.md), or remove the bundle."]
    if not isinstance(revoked, list):
        return None, ["serving_release_revoked is a %s: give a list of key ids, key names or release digests."
                      % v.type_name(revoked)]
    if not bundle:
        return None, ["serving_release_keys is set but no signed release is given: set serving_release_bundle to "
                      "the .sig that tools/release_sign.py wrote for this plan's release-part.json."]
    try:
        checked = rs.verify(bundle, rs.trusted_keys(keys), revoked=rs.revocations(revoked), today=today)
    except (rs.ReleaseError, ValueError) as error:
        return None, ["signed release refused: %s" % error]
    if not isinstance(checked["release"], dict):
        return None, ["the signed release holds the weights only (no mm3_release part: signed by model_signing "
                      "itself?): sign the plan's release-part.json with tools/release_sign.py statement --release."]
    return checked, []


def release_trust(keys, revoked):
    """The trust file a node's start check reads (rs.trust_document) for release_keys less
    release_revoked; None without keys or with keys or revocations release_verify already refuses
    (the same trusted_keys and revocations checks: a verified release always has one)."""
    if not keys:
        return None
    try:
        return rs.trust_document(keys, revoked or [])
    except (rs.ReleaseError, ValueError):
        return None


def release_pins(checked):
    """The pins a verified release (release_verify's result, or None) gives where the inventory sets
    none: {'revision': 40-hex, 'image': {repository, digest} or {digest, local_id}}."""
    signed = (checked or {}).get("release") or {}
    pins = {}
    if v.is_git_commit(str(signed.get("revision") or "")):
        pins["revision"] = str(signed["revision"])
    images = signed.get("images") if isinstance(signed.get("images"), list) else []
    ref = str(images[0]) if len(images) == 1 else ""
    repository, _, digest = ref.rpartition("@")
    if repository and v.is_image_id(digest):
        pins["image"] = {"repository": repository, "digest": digest}
    elif v.is_image_id(ref):
        pins["image"] = {"digest": ref, "local_id": True}
    return pins


def release_check(spec, checked):
    """Bind a verified release (release_verify's result) to the resolved spec: (summary, blockers).
    The manifest pin comes from the signed release when the inventory sets none, and every part of
    RELEASE_PARTS must equal what this spec would run; a refusal names the parts."""
    signed = checked["release"]
    planned = release_part(spec)
    if planned["manifest_sha256"] is None and v.is_sha256(signed.get("manifest_sha256") or ""):
        planned["manifest_sha256"] = signed["manifest_sha256"]  # the pin comes from the signed release
    differ = rs.release_differences({p: signed.get(p) for p in RELEASE_PARTS},
                                    {p: planned[p] for p in RELEASE_PARTS})
    if differ:
        return None, ["this deployment differs from the signed release %s (key '%s') in: %s. Deploy what was "
                      "signed, or plan again and have the new release-part.json signed." % (
                          checked["release_digest"][:16], checked["key"], ", ".join(differ))]
    return {"key": checked["key"], "key_id": checked["key_id"], "digest": checked["release_digest"],
            "files": len(checked["entries"]), "manifest_sha256": planned["manifest_sha256"],
            "eval_set": signed.get("eval_set")}, []


def release_line(spec):
    """What status.yml says of a node's signed release: the key and release that verified, the
    refusal (a revoked or expired key, a differing part: naming it), or that there is none."""
    spec = spec or {}
    release = spec.get("release")
    if release:
        return "signed by key %s (release %s)" % (release.get("key"), str(release.get("digest"))[:16])
    refusal = spec.get("release_refusal") or []
    if refusal:
        text = str(refusal[0])
        return "signed release REFUSED: %s" % (text[len("signed release refused: "):]
                                               if text.startswith("signed release refused: ") else text)
    return "unsigned (the manifest pin is the anchor)"


def serving_blockers_text(spec):
    """The refusal message: one blocker per line."""
    lines = ["serving: profile '%s' (%s) refused:" % (spec.get("profile"), spec.get("engine"))]
    lines += ["  - " + b for b in spec.get("blockers", [])]
    return "\n".join(lines)


def engine_url(spec):
    """The base URL a client on the node itself reaches the engine at: loopback when the engine
    binds every address, an IPv6 address in brackets (model_server's readiness wait, diagnose,
    the verification)."""
    host = str((spec or {}).get("bind_address") or "127.0.0.1")
    if host in ("0.0.0.0", "::", "localhost"):
        host = "127.0.0.1"
    if ":" in host:
        host = "[%s]" % host
    return "http://%s:%s" % (host, (spec or {}).get("port"))


def health_url(spec):
    """The URL a probe on the node itself asks for the engine's health (engine_url + the
    engine's health path)."""
    return engine_url(spec) + ((spec or {}).get("health_path") or "/health")


class FilterModule(object):
    """serving_resolve, serving_blockers_text, serving_engine_url, serving_health_url,
    serving_release_part, serving_release_line."""

    def filters(self):
        return {
            "serving_resolve": serving_resolve,
            "serving_blockers_text": serving_blockers_text,
            "serving_engine_url": engine_url,
            "serving_health_url": health_url,
            "serving_release_part": release_part,
            "serving_release_line": release_line,
        }
