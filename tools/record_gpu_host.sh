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
# The engines' own argument lists, as their argparse holds them, where an engine is installed on
# the host itself (an engine image is recorded with tools/engine_args/record_image.sh): the same
# dump the serving role's recorded lists come from.
here=$(cd "$(dirname "$0")" && pwd)
for engine in vllm sglang; do
  python3 - "$engine" < "$here/engine_args/dump_parser.py" > "$out/argparse-$engine.json" 2>&1
done
ls -la "$out"
