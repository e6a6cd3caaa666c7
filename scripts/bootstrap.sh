#!/usr/bin/env bash
# Controller set-up, idempotent: a Python >= 3.12 interpreter (ansible-core 2.21 needs it),
# the virtualenv .venv with requirements.lock, and the collections our roles use, taken from
# the pinned `ansible` wheel on PyPI (Ansible Galaxy is not reachable from our sites or CI).
# A stamp (hash of the lock and of this script) makes a second run a no-op.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
venv=${VENV:-.venv}
ansible_pkg=ansible==14.5.0   # the community package whose wheel carries the collections
# ... and the sha256 of that wheel as PyPI lists it (https://pypi.org/simple/ansible/): the
# collections come from these bytes or from nothing.
ansible_sha256=245623ccc2d31d0f6f4bdb63168d550cad305fb032cc43d96e8f61ce8ab0ba84
collections=(community/docker ansible/posix community/general community/library_inventory_filtering_v1 kubernetes/core)

find_python() {
  local c
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  # 3.12 first: requirements.lock is resolved and tested with it.
  for c in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
           python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13 python3; do
    if command -v "$c" >/dev/null 2>&1 \
       && "$c" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$c"; return
    fi
  done
  return 1
}

# The gateway tests (tests/test_gateway_haproxy.py) run the distribution's HAProxy with its Lua
# JSON parser on this machine, as the gateway role installs them on a node; the Kubernetes
# weights pre-fill test (tests/test_k8s_manifests.py) runs the Job's script against a real rsync
# daemon on loopback; the apt signing key tests (tests/unit/test_apt_signing_key.py) make a test
# key and sign a file: repository with the real gpg; the HSM release test
# (tests/unit/test_release_signing.py) signs in SoftHSM 2 (a real PKCS#11 module) with OpenSC's
# pkcs11-tool.
if ! command -v haproxy >/dev/null 2>&1 || ! ls /usr/lib/*/lua/5.*/cjson.so >/dev/null 2>&1 \
   || ! command -v rsync >/dev/null 2>&1 || ! command -v gpg >/dev/null 2>&1 \
   || ! command -v pkcs11-tool >/dev/null 2>&1 || ! [ -e /usr/lib/softhsm/libsofthsm2.so ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing haproxy, lua-cjson, rsync, gpg, softhsm2 and opensc (apt) for the gateway, pre-fill and key tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy lua-cjson rsync gpg \
      softhsm2 opensc >/dev/null
    # rsync's packaged daemon stays off too (the test starts its own on loopback).
    systemctl disable --now rsync >/dev/null 2>&1 || true
    # Only the binary is needed here; the packaged service stays off on the controller.
    systemctl disable --now haproxy >/dev/null 2>&1 || true
  else
    echo "bootstrap: the gateway, pre-fill and key tests need haproxy, lua-cjson, rsync, gpg, softhsm2 and opensc: apt-get install haproxy lua-cjson rsync gpg softhsm2 opensc" >&2
    exit 1
  fi
fi

# promtool and amtool (tests/test_monitoring_rules.py: `promtool check config`, `promtool test
# rules`, `amtool check-config`) from the same Debian packages the monitoring role installs on the
# monitoring host, unpacked into .cache/tools/bin: no service is installed or started here.
tools=.cache/tools/bin
if [ ! -x "$tools/promtool" ] || [ ! -x "$tools/amtool" ]; then
  if command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
    echo "bootstrap: unpacking promtool and amtool from Debian's prometheus packages into $tools"
    debs=$(mktemp -d)
    (cd "$debs" && { apt-get download prometheus prometheus-alertmanager >/dev/null 2>&1 \
       || { [ "$(id -u)" = 0 ] && apt-get update -qq && apt-get download prometheus prometheus-alertmanager >/dev/null; }; })
    mkdir -p "$tools"
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$debs/root"; done
    install -m 0755 "$debs/root/usr/bin/promtool" "$debs/root/usr/bin/amtool" "$tools/"
    rm -rf "$debs"
  else
    echo "bootstrap: the monitoring tests need promtool and amtool: apt-get install prometheus prometheus-alertmanager" >&2
    exit 1
  fi
fi

stamp="$venv/.mm3-stamp"
want=$(cat requirements.lock "$0" images/debian-systemd/mm3_zipimport_cache.py | sha256sum | cut -c1-16)
if [ -x "$venv/bin/ansible-playbook" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
   && [ -d collections/ansible_collections/community/docker ]; then
  echo "bootstrap: $venv and collections are current"
  exit 0
fi

py=$(find_python) || {
  cat >&2 <<'MSG'
bootstrap: no Python >= 3.12 found (ansible-core 2.21 requires it; python3 here is older).
  Fix one of:  apt-get install python3.12-venv   (Ubuntu 24.04 / Debian 13)
               pyenv install 3.12               (then rerun; ~/.pyenv/versions is searched)
               PYTHON=/path/to/python3.12 make test
MSG
  exit 1
}
echo "bootstrap: controller Python $("$py" -c 'import sys; print(sys.version.split()[0])') ($py)"
start=$(date +%s)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi
# Every package, pip included, must match a sha256 recorded in the lock (make lock): trust ends
# at pinned values, not at whatever the index serves.
piplog=$(mktemp)
if ! "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes -r requirements.lock >"$piplog" 2>&1; then
  grep -v '^WARNING: Location' "$piplog" >&2 || true
  echo "bootstrap: pip refused requirements.lock (above): a file that does not match its pinned sha256" >&2
  echo "bootstrap: is never installed; if the lock changed on purpose, regenerate it with make lock" >&2
  rm -f "$piplog"; exit 1
fi
grep -v '^WARNING: Location' "$piplog" || true
rm -f "$piplog"
"$venv/bin/python" -c 'import ansible, molecule, testinfra, docker, huggingface_hub' \
  || { echo "bootstrap: packages missing after pip install (see above)" >&2; exit 1; }
# The controller's own module runs (connection: local, delegate_to: localhost) use this Python: it
# gets the bytecode cache the test hosts carry (images/debian-systemd/mm3_zipimport_cache.py;
# every task otherwise compiles ansible.module_utils again from its AnsiballZ zip), in a directory
# of the venv that only its owner writes.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
install -m 0644 images/debian-systemd/mm3_zipimport_cache.py "$site/mm3_zipimport_cache.py"
install -d -m 0700 "$venv/zipimport-cache"
echo "import mm3_zipimport_cache; mm3_zipimport_cache.install('$(cd "$venv" && pwd)/zipimport-cache')" \
  > "$site/mm3-zipimport-cache.pth"

echo "bootstrap: collections from the $ansible_pkg wheel (no Galaxy)"
wheels=$(mktemp -d)
echo "$ansible_pkg --hash=sha256:$ansible_sha256" > "$wheels/pin.txt"
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps --require-hashes -d "$wheels" \
  -r "$wheels/pin.txt" 2>&1 | grep -v '^WARNING: Location' || true
echo "$ansible_sha256  $(ls "$wheels"/ansible-*.whl 2>/dev/null | head -1)" | sha256sum --check --quiet \
  || { echo "bootstrap: the $ansible_pkg wheel is missing or not the pinned sha256 $ansible_sha256" >&2; exit 1; }
rm -rf collections.new && mkdir -p collections.new/ansible_collections
"$venv/bin/python" - "$wheels" collections.new "${collections[@]}" <<'PY' \
  || { echo "bootstrap: could not extract ${collections[*]} from the wheel" >&2; exit 1; }
import glob, sys, zipfile
wheels, dest, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(glob.glob(wheels + "/ansible-*.whl")[0]) as whl:
    for name in wanted:
        members = [m for m in whl.namelist() if m.startswith(f"ansible_collections/{name}/")]
        if not members:
            sys.exit(f"collection {name} is not in the wheel")
        whl.extractall(dest, members)
PY
rm -rf "$wheels"
# Replace only the vendor collections: collections/ansible_collections/mm3 is the project's own
# (tracked in git, the code its modules and filters share).
mkdir -p collections/ansible_collections
for name in "${collections[@]}"; do
  rm -rf "collections/ansible_collections/$name"
  mkdir -p "collections/ansible_collections/${name%/*}"
  mv "collections.new/ansible_collections/$name" "collections/ansible_collections/$name"
done
rm -rf collections.new
echo "$want" > "$stamp"
echo "bootstrap: done in $(( $(date +%s) - start )) s"
