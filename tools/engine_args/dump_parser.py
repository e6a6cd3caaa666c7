"""Dump an engine's command-line parser whole, as JSON, from the engine itself.

Runs with the engine's own Python inside its image (stdlib only, Python >= 3.8):

    docker run --rm -i --network none --entrypoint python3 IMAGE - vllm < tools/engine_args/dump_parser.py

(tools/engine_args/record_image.sh does exactly that and adds the image's ID.) It builds the
parser the way the server's command line builds it, then writes:

  parser   the parser's own settings (class and its bases, prog, allow_abbrev, prefix_chars,
           fromfile_prefix_chars, whether it has options that look like negative numbers)
  actions  every action whole: option strings, dest, nargs, const, default (repr), type (its
           name), choices, required, help, metavar, the action's class and bases, its group, and
           whether the engine marks it deprecated
  probes   what the real parser made of a set of argument lists (the namespace values that
           differ from the defaults, or the error it printed): the engine's own answer to
           `--flag=value`, prefixes, `--no-x`, repeated flags, vLLM's `--flag_name` and
           `--model` rewriting. The project's canonicalizer is tested against these.

vllm:   `vllm serve` = vllm.entrypoints.cli.main: a FlexibleArgumentParser with subparsers, the
        serve subcommand's parser from ServeSubcommand.subparser_init (make_arg_parser);
        parse_args on the top-level parser (it rewrites the argument list before argparse).
sglang: `sglang serve` = sglang.cli.serve -> sglang.srt.server_args.prepare_server_args:
        argparse.ArgumentParser(prog="sglang serve") + ServerArgs.add_cli_args.
"""
import argparse
import contextlib
import io
import json
import sys


def _name(obj):
    if obj is None:
        return None
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)


def _plain(value):
    """A JSON value for a choice: itself when it is a scalar, else its repr."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def action_record(action, group, deprecated):
    """One argparse action, every attribute argparse keeps for it."""
    choices = action.choices
    if choices is not None:
        try:
            choices = [_plain(c) for c in choices]
        except TypeError:
            choices = repr(choices)
    nargs = action.nargs
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "nargs": nargs if nargs is None or isinstance(nargs, int) else str(nargs),
        "const": repr(action.const),
        "default": repr(action.default),
        "type": _name(action.type),
        "choices": choices,
        "required": bool(action.required),
        "help": action.help if isinstance(action.help, str) or action.help is None else repr(action.help),
        "metavar": action.metavar if action.metavar is None or isinstance(action.metavar, str)
        else [str(m) for m in action.metavar],
        "action": type(action).__name__,
        "action_bases": [c.__name__ for c in type(action).__mro__[1:] if c is not object],
        "group": group,
        "deprecated": bool(deprecated or getattr(action, "deprecated", False)),
    }


def parser_record(parser):
    groups = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            groups.setdefault(id(action), group.title)
    deprecated = {id(a) for a in getattr(parser, "_deprecated", ())}
    return {
        "parser": {
            "class": type(parser).__name__,
            "bases": [c.__name__ for c in type(parser).__mro__[1:] if c is not object],
            "prog": parser.prog,
            "allow_abbrev": parser.allow_abbrev,
            "prefix_chars": parser.prefix_chars,
            "fromfile_prefix_chars": parser.fromfile_prefix_chars,
            "has_negative_number_optionals": bool(parser._has_negative_number_optionals),
            "argument_default": repr(parser.argument_default),
            "conflict_handler": parser.conflict_handler,
        },
        "actions": [action_record(a, groups.get(id(a)), id(a) in deprecated) for a in parser._actions],
    }


def probe(parse, parser, argv):
    """What the parser makes of argv: {dest: repr(value)} for what differs from the defaults,
    or the error argparse printed (it exits)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace = parse(argv)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return {"argv": argv, "error": lines[-1] if lines else "exit"}
    except Exception as exc:  # the engine's own rewriting raised
        return {"argv": argv, "error": "%s: %s" % (type(exc).__name__, exc)}
    defaults = {a.dest: a.default for a in parser._actions}
    values = {k: repr(v) for k, v in sorted(vars(namespace).items())
              if k in defaults and v != defaults[k]}
    return {"argv": argv, "set": values}


# Argument lists whose outcome the canonicalizer must reproduce (tests/unit/test_engine_args.py).
VLLM_PROBES = [
    ["--tensor-parallel-size", "8", "--tensor-parallel-size", "4"],
    ["--tensor-parallel-size", "8", "-tp", "4"],
    ["--tensor-parallel-size=4"],
    ["-tp", "4"],
    ["-tp=4"],
    ["-tp4"],
    ["--tensor_parallel_size", "4"],
    ["--tensor_parallel_size=4"],
    ["--tensor-parallel", "4"],
    ["--tensor", "4"],
    ["--api-key", "shortkey"],
    ["--api-key=shortkey"],
    ["--enable-log-requests"],
    ["--enable-log-req"],
    ["--enable-log"],
    ["--no-enable-log-requests"],
    ["--enable-log-outputs"],
    ["--enable-auto-tool-choice"],
    ["--enable-auto-tool-choice", "--no-enable-auto-tool-choice"],
    ["--model", "/other"],
    ["--model=/other"],
    ["--block-size"],
    ["--block-size", "128", "--max-model-len", "-1"],
    ["--gpu-memory-utilization=1.5"],
    ["--allowed-media-domains", "a.example", "b.example"],
    ["--allowed-media-domains"],
    ["--served-model-name", "a", "b"],
    ["--enforce-eager", "extra"],
    ["--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3"],
    ["--host", "0.0.0.0", "--port", "8001"],
    ["--trust-remote-code"],
    ["--max-model-len", "64k"],
    ["--max-model-len.x", "1"],
    ["--speculative-config.num_speculative_tokens", "3"],
    ["-O3"],
    ["--unknown-flag", "1"],
    ["--", "--enforce-eager"],
]

SGLANG_PROBES = [
    ["--tp", "8", "--tp", "4"],
    ["--tp-size", "8", "--tensor-parallel-size", "4"],
    ["--tp=4"],
    ["--tp-size=4"],
    ["--tp_size", "4"],
    ["--tensor-parallel", "4"],
    ["--mem-fraction-static=1.5"],
    ["--mem-fraction-static", "1.5"],
    ["--mem-fraction-stat", "0.5"],
    ["--api-key", "shortkey"],
    ["--log-requests"],
    ["--log-request"],
    ["--log-req"],
    ["--log"],
    ["--model", "/other"],
    ["--model-path=/other"],
    ["--reasoning-parser"],
    ["--reasoning-parser", "auto", "--tool-call-parser", "auto"],
    ["--attention-backend", "fa4", "--mm-attention-backend", "flashinfer_cudnn",
     "--moe-runner-backend", "deep_gemm"],
    ["--trust-remote-code"],
    ["--enable-metrics"],
    ["--chunked-prefill-size", "-1"],
    ["--watchdog-timeout", "3600", "--skip-server-warmup"],
    ["--served-model-name", "x"],
    ["--host", "0.0.0.0", "--port", "30001"],
    ["--skip-server-warmup", "extra"],
    ["--unknown-flag", "1"],
]


def vllm():
    import vllm as vllm_pkg
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    sys.argv[0] = "vllm"  # the parser's prog, as `vllm serve` names it
    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    parser = serve.ServeSubcommand().subparser_init(subparsers)
    record = parser_record(parser)
    record["version"] = vllm_pkg.__version__
    record["command"] = ["vllm", "serve"]
    record["probes"] = [probe(lambda argv: top.parse_args(["serve", "/models/m"] + argv), parser, argv)
                        for argv in VLLM_PROBES]
    return record


def sglang():
    import sglang as sglang_pkg
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    record = parser_record(parser)
    record["version"] = getattr(sglang_pkg, "__version__", None)
    record["command"] = ["sglang", "serve"]
    record["probes"] = sglang_probes(parser)
    return record


def sglang_probes(parser):
    return [probe(lambda argv: parser.parse_args(["--model-path", "/models/m"] + argv), parser, argv)
            for argv in SGLANG_PROBES]


def main():
    engine = sys.argv[1] if len(sys.argv) > 1 else ""
    if engine not in ("vllm", "sglang"):
        sys.exit("usage: dump_parser.py vllm|sglang")
    record = vllm() if engine == "vllm" else sglang()
    record["python"] = sys.version.split()[0]
    json.dump(record, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
