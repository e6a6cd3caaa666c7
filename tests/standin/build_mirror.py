#!/usr/bin/env python3
"""Build the stand-in "internal mirror": signed apt repositories of stand-in packages.

STAND-IN (tests only). Nothing from NVIDIA or AMD can be fetched on the build machines, so
this builds, with dpkg-deb, packages carrying the real package names and versions (CUDA
repository for Debian 12, NVIDIA Container Toolkit repository, AMD's amdgpu and ROCm
repositories), whose binaries replay recorded tool output (see bin/ and fixtures/). The CUDA
repository's fabric packages (names, versions, Provides) come from the RECORDED index
fixtures/nvidia-cuda-repo.Packages, and AMD's repositories (paths, names, versions) from the
RECORDED index fixtures/amd-rocm-repo.Packages, never from the roles' variables, so a name, a
version or a repository path the roles get wrong does not install here either.
Each repository is laid out like its upstream (flat for CUDA and the toolkit, dists/ for
AMD), indexed (Packages, Release) and signed with a throw-away key (InRelease, Release.gpg),
so the roles' key download, `signed-by` and pinning paths run exactly as against a real
mirror. Runs inside a Debian container (needs dpkg-deb, gpg, python3); stdlib only.

usage: build_mirror.py SOURCE_DIR OUTPUT_DIR
"""
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

DRIVER_NEW = "580.95.05"
DRIVER_OLD = "570.133.20"
FM_OTHER = "580.82.07"
TOOLKIT = "1.18.0"


def driver_packages(ver):
    """The driver itself (names the roles' Debian 12 vars use; NOT from a recorded index: no public
    capture of NVIDIA's debian12 Packages file was found, see fixtures/README.md)."""
    rev = ver + "-1"
    mod = [("standin-modinfo", "usr/bin/standin-modinfo", {"@VERSION@": ver}),
           ("standin-reboot", "usr/sbin/standin-reboot", {}),
           ("dkms", "usr/sbin/dkms", {"@MODULE@": "nvidia", "@VERSION@": ver})]
    return [
        dict(name="nvidia-kernel-open-dkms", version=rev, files=mod,
             description="NVIDIA open GPU kernel modules (DKMS) - STAND-IN"),
        dict(name="nvidia-persistenced", version=rev,
             files=[("nvidia-persistenced", "usr/bin/nvidia-persistenced", {})],
             # Debian's unit and postinst as recorded (runs as nvpd, which the postinst adds)
             units={"nvidia-persistenced.service": PERSISTENCED_UNIT},
             postinst=PERSISTENCED_POSTINST,
             description="NVIDIA persistence daemon - STAND-IN"),
        dict(name="nvidia-driver", version=rev,
             depends="nvidia-kernel-open-dkms (= %s), nvidia-persistenced (= %s)" % (rev, rev),
             files=[("nvidia-smi", "usr/bin/nvidia-smi", {})], fixtures=True,
             description="NVIDIA driver metapackage (open kernel modules) - STAND-IN"),
    ]


def recorded_index(path):
    """The stanzas of a recorded Packages file (fixtures/nvidia-cuda-repo.Packages,
    fixtures/amd-rocm-repo.Packages)."""
    stanzas = []
    with open(path) as fh:
        for block in fh.read().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith("#"))
            if fields:
                stanzas.append(fields)
    return stanzas


def fabric_packages(src, versions, arch="amd64"):
    """One stand-in package per recorded stanza of the fabric packages at the given driver versions
    (plus the unversioned nvlsm), under the recorded name, version and Provides; the content is the
    stand-in for what the package is (its base name without the branch)."""
    out = []
    for fields in recorded_index(os.path.join(src, "fixtures", "nvidia-cuda-repo.Packages")):
        name, version = fields["Package"], fields["Version"]
        upstream = version.rsplit("-", 1)[0]
        if fields["Architecture"] != arch or (name != "nvlsm" and upstream not in versions) \
                or "X-Distribution" in fields:  # Ubuntu's driver packages: not in the debian12 repository
            continue
        base = name[:-4] if name[-4:-3] == "-" and name[-3:].isdigit() else name
        pkg = dict(name=name, version=version, provides=fields.get("Provides"), files=[],
                   description="%s (recorded name and version) - STAND-IN" % base)
        if base == "nvidia-fabricmanager":
            pkg.update(files=[("nv-fabricmanager", "usr/bin/nv-fabricmanager", {"@VERSION@": upstream})],
                       units={"nvidia-fabricmanager.service": FM_UNIT})
        elif base == "nvidia-imex":
            pkg.update(files=[("standin-daemon", "usr/bin/nvidia-imex", {})], units={"nvidia-imex.service": IMEX_UNIT})
        elif base == "nvlsm":
            pkg.update(files=[("standin-daemon", "opt/nvidia/nvlsm/sbin/nvlsm", {})])
        out.append(pkg)
    return out


def amd_dkms_version(version):
    """amdgpu-dkms's package version -> the module version DKMS registers: "1:6.16.13.30300000-2278356.22.04"
    -> "6.16.13-2278356.22.04" (recorded pairs: fixtures/amd-rocm-repo.Packages [6031], [DOCS])."""
    upstream, build = version.split(":")[-1].rsplit("-", 1)
    return "%s-%s" % (upstream.rsplit(".", 1)[0], build)


def amd_repositories(src):
    """AMD's repositories as recorded (fixtures/amd-rocm-repo.Packages): one per X-Repository, each
    recorded package with the stand-in content of what it is."""
    repos = {}
    for fields in recorded_index(os.path.join(src, "fixtures", "amd-rocm-repo.Packages")):
        path, suite = fields["X-Repository"].split()
        name, version = fields["Package"], fields["Version"]
        pkg = dict(name=name, version=version, arch=fields["Architecture"], files=[],
                   description="%s (recorded name and version) - STAND-IN" % name)
        if name == "amdgpu-dkms":
            # A srcversion is a checksum of the module's sources; the stand-in's is one of its version.
            srcversion = hashlib.md5(version.encode()).hexdigest()[:23].upper()
            pkg["files"] = [("standin-amdgpu-modinfo", "usr/bin/standin-amdgpu-modinfo", {"@SRCVERSION@": srcversion}),
                            ("standin-reboot", "usr/sbin/standin-reboot", {}),
                            ("dkms", "usr/sbin/dkms", {"@MODULE@": "amdgpu", "@VERSION@": amd_dkms_version(version)})]
        elif name == "rocm-smi-lib":
            pkg.update(files=[("rocm-smi", "opt/rocm/bin/rocm-smi", {})],
                       links={"usr/bin/rocm-smi": "/opt/rocm/bin/rocm-smi"}, fixtures=True)
        elif name == "rocm-core":
            pkg["info_version"] = version.split("~")[0]
        elif name == "rocm":
            pkg["depends"] = "rocm-core (= %s), rocm-smi-lib" % version
        repo = repos.setdefault(path, dict(flat=False, suite=suite, key="../" * (path.count("/") + 1) + "rocm/rocm.gpg.key",
                                           packages=[]))
        repo["packages"].append(pkg)
    return repos


# RECORDED (fixtures/nvidia-persistenced/README.md): read from SOURCE_DIR when the package is built.
PERSISTENCED_UNIT = ("fixtures", "nvidia-persistenced", "debian.service")
PERSISTENCED_POSTINST = ("fixtures", "nvidia-persistenced", "debian.postinst")
FM_UNIT = """[Unit]
Description=NVIDIA fabric manager service (stand-in)

[Service]
User=root
Type=simple
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""
IMEX_UNIT = """[Unit]
Description=NVIDIA IMEX service (stand-in)

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg

[Install]
WantedBy=multi-user.target
"""

REPOS = {
    # flat, like https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/
    "cuda/debian12/x86_64": dict(
        flat=True, key="3bf863cc.pub",
        packages=driver_packages(DRIVER_NEW) + driver_packages(DRIVER_OLD),
        # + fabric_packages(src, (DRIVER_NEW, DRIVER_OLD, FM_OTHER)) in main(): from the recorded index.
        recorded=(DRIVER_NEW, DRIVER_OLD, FM_OTHER)),
    # The distribution archive's headers for the kernel these containers run on (whatever the
    # build machine boots: its own kernel has no Debian headers package). Flat, signed like the rest.
    "kernel": dict(
        flat=True, key="standin.asc",
        packages=[dict(name="linux-headers-" + os.uname().release, version="1.0-standin",
                       files=[("standin-headers-makefile", "usr/src/linux-headers-%s/Makefile" % os.uname().release,
                               {})],
                       description="Headers for the running kernel - STAND-IN")]),
    # flat, like https://nvidia.github.io/libnvidia-container/stable/deb/amd64/
    "libnvidia-container/stable/deb/amd64": dict(
        flat=True, key="../../gpgkey",
        packages=[
            dict(name="nvidia-container-toolkit-base", version=TOOLKIT + "-1",
                 files=[("nvidia-ctk", "usr/bin/nvidia-ctk", {"@TOOLKIT_VERSION@": TOOLKIT}),
                        ("nvidia-container-runtime", "usr/bin/nvidia-container-runtime", {})],
                 description="NVIDIA Container Toolkit Base - STAND-IN"),
            dict(name="nvidia-container-toolkit", version=TOOLKIT + "-1",
                 depends="nvidia-container-toolkit-base (= %s-1)" % TOOLKIT,
                 files=[("nvidia-container-runtime-hook", "usr/bin/nvidia-container-runtime-hook", {})],
                 description="NVIDIA Container toolkit - STAND-IN"),
        ]),
    # AMD's (amdgpu/<driver>/ubuntu, rocm/apt/<rocm>, suite jammy): amd_repositories(src) in main().
}


def recorded_text(src, text):
    """A text given inline, or the file of a recorded fixture ((directory, ..., name) under SOURCE_DIR)."""
    if isinstance(text, tuple):
        with open(os.path.join(src, *text)) as fh:
            return fh.read()
    return text


def build_deb(src, pkg, pool):
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(os.path.join(root, "DEBIAN"))
        for srcname, dest, subs in pkg.get("files", []):
            text = open(os.path.join(src, "bin", srcname)).read()
            for k, v in subs.items():
                text = text.replace(k, v)
            path = os.path.join(root, dest)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text)
            os.chmod(path, 0o755)
        for dest, target in pkg.get("links", {}).items():
            path = os.path.join(root, dest)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(target, path)
        for unit, text in pkg.get("units", {}).items():
            path = os.path.join(root, "lib/systemd/system", unit)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(recorded_text(src, text))
        if pkg.get("postinst"):
            path = os.path.join(root, "DEBIAN", "postinst")
            with open(path, "w") as fh:
                fh.write(recorded_text(src, pkg["postinst"]).replace("#DEBHELPER#", ""))
            os.chmod(path, 0o755)
        if pkg.get("fixtures"):
            shutil.copytree(os.path.join(src, "fixtures"), os.path.join(root, "usr/share/standin/gpu"))
        if pkg.get("info_version"):
            os.makedirs(os.path.join(root, "opt/rocm/.info"))
            with open(os.path.join(root, "opt/rocm/.info/version"), "w") as fh:
                fh.write(pkg["info_version"] + "\n")
        doc = os.path.join(root, "usr/share/doc", pkg["name"])
        os.makedirs(doc, exist_ok=True)
        with open(os.path.join(doc, "STAND-IN"), "w") as fh:
            fh.write("Stand-in package built by tests/standin/build_mirror.py; not NVIDIA/AMD software.\n")
        control = ["Package: " + pkg["name"], "Version: " + pkg["version"], "Architecture: " + pkg.get("arch", "amd64"),
                   "Maintainer: mm3 test stand-ins <standin@localhost>", "Section: misc", "Priority: optional"]
        if pkg.get("depends"):
            control.append("Depends: " + pkg["depends"])
        if pkg.get("provides"):
            control.append("Provides: " + pkg["provides"])
        control.append("Description: " + pkg["description"])
        with open(os.path.join(root, "DEBIAN/control"), "w") as fh:
            fh.write("\n".join(control) + "\n")
        fname = "%s_%s_%s.deb" % (pkg["name"], pkg["version"].split(":")[-1], pkg.get("arch", "amd64"))
        out = os.path.join(pool, fname)
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, out],
                       check=True, stdout=subprocess.DEVNULL)
        return out


def stanza(deb, filename):
    fields = subprocess.run(["dpkg-deb", "-f", deb], check=True, capture_output=True, text=True).stdout
    data = open(deb, "rb").read()
    return (fields.rstrip("\n") + "\nFilename: %s\nSize: %d\nMD5sum: %s\nSHA256: %s\n" % (
        filename, len(data), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()))


def release(index_dir, files, suite):
    lines = ["Origin: mm3 stand-in mirror", "Label: stand-in"]
    if suite != "./":
        lines += ["Suite: " + suite, "Codename: " + suite, "Components: main"]
    lines += ["Architectures: amd64", "Date: Sun, 29 Nov 2026 00:00:00 UTC"]
    for algo, name in (("md5", "MD5Sum"), ("sha256", "SHA256")):
        lines.append(name + ":")
        for rel in files:
            data = open(os.path.join(index_dir, rel), "rb").read()
            lines.append(" %s %d %s" % (hashlib.new(algo, data).hexdigest(), len(data), rel))
    return "\n".join(lines) + "\n"


def gpg(gnupghome, *args):
    subprocess.run(["gpg", "--batch", "--yes", "--homedir", gnupghome, *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(src, out):
    gnupghome = tempfile.mkdtemp()
    gpg(gnupghome, "--passphrase", "", "--quick-gen-key", "mm3 stand-in mirror <standin@localhost>",
        "ed25519", "sign", "never")
    for path, repo in dict(REPOS, **amd_repositories(src)).items():
        base = os.path.join(out, path)
        pool = base if repo["flat"] else os.path.join(base, "pool/main")
        os.makedirs(pool, exist_ok=True)
        packages = repo["packages"] + (fabric_packages(src, repo["recorded"]) if repo.get("recorded") else [])
        debs = [build_deb(src, pkg, pool) for pkg in packages]
        if repo["flat"]:
            index_dir, rel_dir, suite = base, "", "./"
        else:
            index_dir, rel_dir, suite = os.path.join(base, "dists", repo["suite"]), "main/binary-amd64/", repo["suite"]
        os.makedirs(os.path.join(index_dir, rel_dir), exist_ok=True)
        text = "\n".join(stanza(d, os.path.relpath(d, base) if not repo["flat"] else "./" + os.path.basename(d))
                         for d in debs)
        with open(os.path.join(index_dir, rel_dir, "Packages"), "w") as fh:
            fh.write(text)
        with gzip.open(os.path.join(index_dir, rel_dir, "Packages.gz"), "wt") as fh:
            fh.write(text)
        with open(os.path.join(index_dir, "Release"), "w") as fh:
            fh.write(release(index_dir, [rel_dir + "Packages", rel_dir + "Packages.gz"], suite))
        gpg(gnupghome, "--clearsign", "-o", os.path.join(index_dir, "InRelease"), os.path.join(index_dir, "Release"))
        gpg(gnupghome, "-abs", "-o", os.path.join(index_dir, "Release.gpg"), os.path.join(index_dir, "Release"))
        keyfile = os.path.normpath(os.path.join(base, repo["key"]))
        os.makedirs(os.path.dirname(keyfile), exist_ok=True)
        gpg(gnupghome, "--armor", "--export", "-o", keyfile)
    # The throw-away key's fingerprint, for the test harness to pin as a site pins its vendor's
    # (molecule/nvidia_host): the roles trust a key_url only at a pinned fingerprint.
    listing = subprocess.run(["gpg", "--batch", "--homedir", gnupghome, "--with-colons", "--list-keys"],
                             check=True, capture_output=True, text=True).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    with open(os.path.join(out, "standin-key.fpr"), "w") as fh:
        fh.write(fingerprint + "\n")
    shutil.rmtree(gnupghome, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
