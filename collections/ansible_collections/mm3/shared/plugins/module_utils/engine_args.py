# -*- coding: utf-8 -*-
"""An engine's argument list read the way the engine's argparse reads it.

The engines parse argv with argparse: `--flag=value` equals `--flag value`, a unique prefix of an
option is that option (allow_abbrev), the last of a repeated flag wins, `--no-x` sets what `--x`
sets, and vLLM's FlexibleArgumentParser first rewrites `--flag_name` to `--flag-name`, `-O3` to
`--optimization-level 3` and `--flag.key value` into `--flag '<json>'`. A check that reads only
the form the matrix writes is bypassed by the others. So every check of an engine's flags reads
the occurrences `canonicalize` returns, each with the destination the engine stores it under,
from the engine's recorded argument list (roles/serving/files/engine_args/*.json, recorded by
tools/engine_args/ from the engine itself).

Pure functions over that record (the JSON's `parser` and `actions`):
  table(record)                 the option strings, their actions and the parser's settings
  canonicalize(tokens, table)   occurrences [{dest, option (the action's `--` name), flag (as
                                written), token, values, value, origin, form}] and problems
                                [{kind, origin, token, message}]
  dest_of(option, table)        the dest an option string (or an accepted abbreviation) sets
  engine_env(spec)              the engine's environment as the container gets it (the unit's
                                -e, the pod's env, and the signed release's env)

Problems are refused by the caller, which names the variable a token came from (`origins`):
an unknown option, an abbreviation (with the option it abbreviates) or an ambiguous prefix,
an option given twice in any form, an option that needs a value without one, a value for an
option that takes none, a value outside the option's choices, a stray value, vLLM's dotted
`--flag.key` form, vLLM's `--model` (moved to the positional model) and argparse's `--` separator.
"""
from __future__ import annotations

import re

# argparse's test for a negative number (argparse._negative_number_matcher, Python 3.11/3.12).
NEGATIVE_NUMBER_RE = re.compile(r"^-\d+$|^-\d*\.\d+$")
# vLLM FlexibleArgumentParser.parse_args moves the first token matching this to the positional model.
MOVED_MODEL_RE = re.compile(r"^--model(=.+|$)")
# Parsers that rewrite the argument list before argparse reads it (vLLM).
FLEXIBLE_PARSERS = ("FlexibleArgumentParser",)


def table(record):
    """The lookup the parser builds from its actions: option string -> action, the positionals in
    order, and the parser's settings. `record` is a recorded argument list (JSON object)."""
    record = record or {}
    parser = record.get("parser") or {}
    options, positionals = {}, []
    for action in record.get("actions") or []:
        if action.get("option_strings"):
            for option in action["option_strings"]:
                options[option] = action
        else:
            positionals.append(action)
    return {
        "options": options,
        "positionals": positionals,
        "allow_abbrev": parser.get("allow_abbrev", True) is not False,
        "prefix_chars": parser.get("prefix_chars") or "-",
        "negative_optionals": bool(parser.get("has_negative_number_optionals")),
        "flexible": parser.get("class") in FLEXIBLE_PARSERS or any(
            base in FLEXIBLE_PARSERS for base in parser.get("bases") or []),
        "engine": ((record.get("source") or {}).get("engine")),
        "version": ((record.get("source") or {}).get("version")),
    }


def canonical(action):
    """The name an action goes by: its first `--` option string (else its first)."""
    options = action.get("option_strings") or [action.get("dest")]
    return next((o for o in options if o.startswith("--")), options[0])


def takes_value(action):
    """How many values an action reads: (minimum, maximum or None for any)."""
    nargs = action.get("nargs")
    if nargs is None:
        return 1, 1
    if isinstance(nargs, int):
        return nargs, nargs
    return {"?": (0, 1), "*": (0, None), "+": (1, None)}.get(str(nargs), (0, None))


def _prefix_matches(flag, tab):
    """The option strings `flag` is a prefix of (argparse._get_option_tuples for `--` options and
    for single-dash options longer than one character)."""
    return sorted(option for option in tab["options"] if option.startswith(flag) and option != flag)


def _rewrite_flexible(token):
    """vLLM FlexibleArgumentParser.parse_args: `--a_b[.c]...` -> `--a-b[.c]` (underscores become
    dashes between `--` and the first '.'), with the value after '=' untouched."""
    if not token.startswith("--"):
        return token
    key, sep, value = token.partition("=")
    head, dot, rest = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest + sep + value


def _classify(token, tab):
    """argparse._parse_optional: ('O', option, explicit value or None, form) for an option,
    ('A',) for a value/positional, ('U', flag, form) for an option argparse would not know,
    ('X', kind, detail) for a form refused here. `form` says how it was written."""
    prefix = tab["prefix_chars"]
    if not token or token[0] not in prefix:
        return ("A",)
    if token == "--":
        return ("X", "separator", None)
    options = tab["options"]
    if token in options:
        return ("O", token, None, "exact")
    if len(token) == 1:
        return ("A",)
    flag, eq, value = token.partition("=")
    if eq and flag in options:
        return ("O", flag, value, "equals")
    if tab["flexible"] and token.startswith("--") and "." in flag:
        return ("X", "dotted", flag)
    # argparse._get_option_tuples: `--` options by prefix when allow_abbrev (a value after '='
    # kept); a single-dash token either a one-letter option with its value attached (-q8) or a
    # prefix of single-dash options, whatever allow_abbrev says (Python 3.11/3.12).
    if token[1] in prefix:
        found = [(o, value if eq else None, "abbreviation") for o in _prefix_matches(flag, tab)] \
            if tab["allow_abbrev"] else []
    else:
        found = [(token[:2], token[2:], "attached")] if token[:2] in options else []
        found += [(o, None, "abbreviation") for o in _prefix_matches(token, tab)]
    if len(found) == 1:
        return ("O",) + found[0]
    if len(found) > 1:
        return ("X", "ambiguous", sorted(o for o, _, _ in found))
    if NEGATIVE_NUMBER_RE.match(token) and not tab["negative_optionals"]:
        return ("A",)
    if " " in token:
        return ("A",)
    return ("U", flag, "unknown")


def dest_of(option, tab, accepted_abbreviations=()):
    """The dest that `option` (an option string, or an abbreviation in accepted_abbreviations that
    the recorded list resolves to one option) sets, or None."""
    action = tab["options"].get(option)
    if action is None and option in (accepted_abbreviations or ()):
        matches = _prefix_matches(option, tab)
        action = tab["options"][matches[0]] if len(matches) == 1 else None
    return action.get("dest") if action else None


def _value(action, option, values):
    """What the action stores: the value(s) for a storing action, True/False/const otherwise."""
    name = action.get("action") or ""
    bases = action.get("action_bases") or []
    if "BooleanOptionalAction" in (name, *bases):
        return not option.startswith("--no-")
    if "_StoreTrueAction" in (name, *bases):
        return True
    if "_StoreFalseAction" in (name, *bases):
        return False
    if takes_value(action) == (0, 0):
        return action.get("const")
    if action.get("nargs") is None or action.get("nargs") == "?":
        return values[0] if values else action.get("const")
    return list(values)


def _problem(kind, origin, token, message):
    return {"kind": kind, "origin": origin, "token": token, "message": message}


def canonicalize(tokens, tab, origins=None, accepted_abbreviations=()):
    """Parse `tokens` (the arguments after `sglang serve` / `vllm serve`) as the engine's argparse
    does. `origins[i]` names where tokens[i] came from (kept on each occurrence and problem).
    `accepted_abbreviations`: prefixes the project relies on (each must still resolve to exactly
    one option in the recorded list, or it is ambiguous like any other).

    Returns (occurrences, problems). Every option occurrence is kept (a repeated one is a
    problem: argparse would keep the last); a problem never aborts the walk."""
    tokens = [str(t) for t in tokens]
    origins = list(origins) if origins is not None else [None] * len(tokens)
    accepted = set(accepted_abbreviations or ())
    if tab["flexible"]:
        rewritten = []
        for token in tokens:
            if token.startswith("-O") and token != "-O" and not token.startswith("--"):
                rewritten.append(["--optimization-level", token[3:] if token[2:3] == "=" else token[2:]])
            else:
                rewritten.append([_rewrite_flexible(token)])
        expanded, expanded_origins, given = [], [], []
        for original, origin, parts in zip(tokens, origins, rewritten):
            expanded += parts
            expanded_origins += [origin] * len(parts)
            given += [original] * len(parts)
    else:
        expanded, expanded_origins, given = tokens, origins, tokens
    kinds = [_classify(token, tab) for token in expanded]
    occurrences, problems = [], []
    i, n = 0, len(expanded)

    # Positionals first: argparse consumes them (possibly empty) before the first option.
    for action in tab["positionals"]:
        low, high = takes_value(action)
        taken = []
        while i < n and kinds[i][0] == "A" and (high is None or len(taken) < high):
            taken.append(expanded[i])
            i += 1
        occurrences.append({"dest": action.get("dest"), "option": None, "flag": None,
                            "token": " ".join(taken), "values": taken,
                            "value": taken[0] if taken and action.get("nargs") in (None, "?") else taken,
                            "origin": expanded_origins[i - 1] if taken else None, "form": "positional"})

    seen = {}
    while i < n:
        kind, token, origin, written = kinds[i], expanded[i], expanded_origins[i], given[i]
        if kind[0] == "A":
            problems.append(_problem("stray", origin, written, "%r follows no option that takes it "
                                     "(the engine refuses it as an unrecognized argument)" % written))
            i += 1
            continue
        if kind[0] == "X":
            if kind[1] == "separator":
                problems.append(_problem("separator", origin, written, "'--' makes the engine read "
                                         "every later argument as a positional one: remove it"))
            elif kind[1] == "dotted":
                base = kind[2].split(".", 1)[0]
                problems.append(_problem("dotted", origin, written, "%s sets part of %s's JSON (vLLM's "
                                         "dotted form, merged behind every other flag): give %s its whole "
                                         "JSON value instead" % (written.split("=", 1)[0], base, base)))
            else:
                problems.append(_problem("ambiguous", origin, written, "%s is ambiguous: the engine could "
                                         "read it as %s; write the option whole" % (
                                             written.split("=", 1)[0], ", ".join(kind[2]))))
            i += 1
            while i < n and kinds[i][0] == "A":  # its values, if any, go with it
                i += 1
            continue
        if kind[0] == "U":
            problems.append(_problem("unknown", origin, written, "%s is not an option of %s %s (its "
                                     "recorded argument list)" % (kind[1], tab.get("engine") or "the engine",
                                                                  tab.get("version") or "")))
            i += 1
            while i < n and kinds[i][0] == "A":
                i += 1
            continue
        _, option, explicit, form = kind
        action = tab["options"][option]
        if form == "attached":
            flag = option
        else:
            flag = written.split("=", 1)[0] if explicit is not None and "=" in written else written
        if form == "abbreviation" and flag in accepted:
            form = "accepted abbreviation"
        elif form == "abbreviation":
            problems.append(_problem("abbreviation", origin, written, "%s abbreviates %s (the engine "
                                     "accepts a unique prefix): write %s" % (flag, canonical(action),
                                                                             canonical(action))))
        if form in ("exact", "equals") and written != token:
            form += ", rewritten"  # vLLM's --flag_name or -O<n>
        if tab["flexible"] and MOVED_MODEL_RE.match(written):
            problems.append(_problem("moved", origin, written, "vLLM moves %s to the front as the positional "
                                     "model (serve <model>), so the model the command names first becomes a "
                                     "stray argument: the model is given once, positionally" % flag))
        low, high = takes_value(action)
        values = []
        i += 1
        if explicit is not None:
            if high == 0:
                problems.append(_problem("explicit", origin, written, "%s takes no value, but %r gives "
                                         "one" % (option, written)))
            else:
                values = [explicit]
        else:
            while i < n and kinds[i][0] == "A" and (high is None or len(values) < high):
                values.append(expanded[i])
                i += 1
            if len(values) < low:
                problems.append(_problem("missing", origin, written, "%s needs %s value%s and has none"
                                         % (option, "a" if low == 1 else low, "" if low == 1 else "s")))
        choices = action.get("choices")
        if isinstance(choices, list) and high != 0:
            for value in values:
                if value not in [str(c) for c in choices]:
                    problems.append(_problem("choice", origin, written, "%s %s is not one of the engine's "
                                             "choices (%s)" % (option, value, ", ".join(str(c) for c in choices))))
        dest = action.get("dest")
        occurrence = {"dest": dest, "option": canonical(action), "flag": flag, "token": written, "values": values,
                      "value": _value(action, option, values), "origin": origin, "form": form}
        if dest in seen:
            first = seen[dest]
            problems.append(_problem("duplicate", origin, written, "%s sets %s, which %s%s already set (the "
                                     "engine keeps the last): give it once" % (
                                         flag, canonical(action), first["flag"], (
                                             " in " + first["origin"]) if first["origin"] and
                                         first["origin"] != origin else "")))
        else:
            seen[dest] = occurrence
        occurrences.append(occurrence)
    return occurrences, problems


def engine_env(spec):
    """[(name, value)] for a resolved serving_spec: HF_HUB_OFFLINE=1, then the entry's and the
    container's environment merged and sorted. One home: the unit's -e options, the pod's env and
    the env a signed release binds are all this list."""
    env = dict(spec.get("env") or {})
    env.update((spec.get("container") or {}).get("env") or {})
    return [("HF_HUB_OFFLINE", "1")] + [(str(key), str(env[key])) for key in sorted(env)]
