#!/usr/bin/env bash
# Record a real GPU host, whole, for the project's stand-ins and fixtures (tests/standin/fixtures,
# tests/fixtures/hardware): what nvidia-smi, lspci, systemd and the installed packages print, and
# the argument lists of any serving engine installed there (argparse, as the engine parses
# them). Writes one file per command under OUT (default ./gpu-host-record), each headed by the
# command and the date, and never changes the host. Run it on a GPU node; commit what a fixture
# needs with its header naming the machine.
set -u
out=${OUT:-./gpu-host-record}
mkdir -p "$out"
rec() {  # rec NAME CMD...: run CMD, keep stdout+stderr and its exit status
  local name=$1; shift
  { echo "# $(date -u +%FT%TZ) on $(uname -n): $*"; timeout 60 "$@" 2>&1; echo "# exit status $?"; } > "$out/$name.txt"
}
rec uname uname -a
rec os-release cat /etc/os-release
rec nvidia-smi nvidia-smi
rec nvidia-smi-q nvidia-smi -q
rec nvidia-smi-topo nvidia-smi topo -m
rec nvidia-smi-nvlink nvidia-smi nvlink --status
rec nvidia-smi-query nvidia-smi --query-gpu=index,pci.bus_id,name,uuid,driver_version,memory.total,mig.mode.current,persistence_mode --format=csv
rec lspci-nn lspci -nn -D
rec lspci-nvidia lspci -vvv -nn -D -d 10de:
rec modinfo-nvidia modinfo nvidia
rec proc-driver cat /proc/driver/nvidia/version
rec dpkg-nvidia sh -c "dpkg-query -W -f='\${Package} \${Version} \${Architecture}\n' | grep -i -E 'nvidia|cuda|fabric|imex|nscq|datacenter-gpu|dcgm' "
rec persistenced-unit systemctl cat nvidia-persistenced
rec fabricmanager-unit systemctl cat nvidia-fabricmanager
rec dcgmi-version dcgmi -v
rec docker-images docker images --digests
rec python-packages sh -c "python3 -m pip list 2>/dev/null | grep -i -E 'vllm|sglang|torch|flashinfer|transformers|triton'"
# The engines' own argument lists, as their argparse holds them (every option string, nargs,
# default, choices, and whether abbreviations are allowed).
for engine in vllm sglang; do
  python3 - "$engine" > "$out/argparse-$engine.json" 2>&1 <<'PY'
import json, sys
engine = sys.argv[1]
try:
    if engine == "vllm":
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        from vllm.utils import FlexibleArgumentParser
        parser = make_arg_parser(FlexibleArgumentParser())
        import vllm; version = vllm.__version__
    else:
        from sglang.srt.server_args import ServerArgs
        import argparse, sglang
        parser = argparse.ArgumentParser(); ServerArgs.add_cli_args(parser); version = sglang.__version__
except Exception as exc:  # not installed here
    print(json.dumps({"engine": engine, "error": repr(exc)})); sys.exit(0)
actions = [{"option_strings": a.option_strings, "dest": a.dest, "nargs": a.nargs,
            "default": repr(a.default), "choices": [repr(c) for c in a.choices] if a.choices else None,
            "action": type(a).__name__} for a in parser._actions]
print(json.dumps({"engine": engine, "version": version, "allow_abbrev": parser.allow_abbrev,
                  "actions": actions}, indent=1))
PY
done
ls -la "$out"
