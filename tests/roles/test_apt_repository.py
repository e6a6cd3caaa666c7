"""roles/apt_repository on its own: the url chosen by the node's architecture, the refusals that
name the caller's variable before anything changes, and the files it renders.

The role runs against the controller in --check --diff mode through ansible-runner (nothing is
written; the template tasks' diffs carry the text they would write). Every case is one rescued
include in one playbook run, to keep the suite's minutes; the node's architecture is the fact
ansible_facts.architecture, set per case. The repositories are a real HTTP server on loopback
(tests/helpers.py http_files) serving only the Release files named below, so a probe of the
wrong path fails.

The two preferences files are golden: GOLDEN_NVIDIA_PREF and GOLDEN_AMD_PREF were recorded by
rendering the templates the roles had before this role existed (roles/nvidia_driver/templates/
nvidia-driver.pref.j2 and roles/amd_rocm/templates/amd-rocm.pref.j2 at commit 2aa36b4) with the
packages and repositories of CASES below: the role must write the same bytes.
"""
import pathlib

import pytest
from helpers import http_files, run_cases

SOURCES_TASK = "Write the apt sources (deb822, signed by their keys)"
PREF_TASK = "Write the apt preferences (the pins that go with a repository)"
KEY_TASK = "Fetch the repository's signing key, trusted only if its fingerprint is pinned"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Docker's real release key (tests/fixtures/apt-keys/README.md) and its published fingerprint.
DOCKER_ASC = (pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "apt-keys" / "docker.asc").read_bytes()
DOCKER_FPR = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
SERVED = {"/cuda/x86_64/Release": b"Origin: NVIDIA\n", "/cuda/sbsa/Release": b"Origin: NVIDIA\n",
          "/debian/dists/bookworm/Release": b"Origin: Debian\n", "/keys/docker.asc": DOCKER_ASC}
PER_ARCH = {"amd64": "{base}/cuda/x86_64/", "arm64": "{base}/cuda/sbsa/"}

GOLDEN_NVIDIA_PREF = (
    "# Managed by Ansible (nvidia_driver): the driver and the fabric pieces that must carry\n"
    "# exactly its version; anything else from the CUDA repository stays below the archive.\n"
    "Package: nvidia-fabricmanager libnvidia-nscq\n"
    "Pin: version 580.126.09-1\n"
    "Pin-Priority: 1001\n"
    "\n"
    "Package: nvidia-driver-580-open nvidia-dkms-580-open\n"
    "Pin: version 580.126.09-1ubuntu1\n"
    "Pin-Priority: 1001\n")
GOLDEN_AMD_PREF = (
    "# Managed by Ansible (amd_rocm): packages from AMD's repositories (or their mirror) win over\n"
    "# the distribution's, as AMD's install guide sets it.\n"
    "Package: *\n"
    "Pin: origin repo.radeon.com\n"
    "Pin-Priority: 600\n"
    "\n"
    "Package: *\n"
    "Pin: origin mirror.example\n"
    "Pin-Priority: 600\n")

# name: (architecture fact, caller, entries, expected outcome: "ok" or phrases of the refusal)
CASES = {
    "an x86_64 node takes the amd64 url of a mapping": (
        "x86_64", "nvidia_container_toolkit",
        [{"name": "t-x86", "variable": "t_x86_repo", "url": PER_ARCH, "signed_by": KEYRING}], "ok"),
    "an aarch64 node takes the arm64 url of a mapping": (
        "aarch64", "nvidia_container_toolkit",
        [{"name": "t-arm", "variable": "t_arm_repo", "url": PER_ARCH, "signed_by": KEYRING}], "ok"),
    "a suite with components (Docker's layout)": (
        "x86_64", "docker_engine",
        [{"name": "t-suite", "variable": "t_suite_repo", "url": "{base}/debian", "suite": "bookworm",
          "components": ["main", "contrib"], "signed_by": KEYRING}], "ok"),
    "the nvidia_driver pins render as its template did": (
        "x86_64", "nvidia_driver",
        [{"name": "t-nvidia", "variable": "t_nvidia_repo", "url": "{base}/cuda/x86_64/", "signed_by": KEYRING,
          "preferences_name": "t-nvidia-driver",
          "preferences_comment": ["the driver and the fabric pieces that must carry",
                                  "exactly its version; anything else from the CUDA repository stays below the "
                                  "archive."],
          "preferences": [
              {"packages": ["nvidia-fabricmanager", "libnvidia-nscq"], "pin": "version 580.126.09-1",
               "priority": 1001},
              {"packages": ["nvidia-driver-580-open", "nvidia-dkms-580-open"],
               "pin": "version 580.126.09-1ubuntu1", "priority": 1001}]}], "ok"),
    "the amd_rocm pins render as its template did": (
        "x86_64", "amd_rocm",
        [{"name": "t-amd", "variable": "t_amd_repo", "url": "{base}/debian", "suite": "bookworm",
          "components": ["main"], "signed_by": KEYRING,
          "preferences_comment": ["packages from AMD's repositories (or their mirror) win over",
                                  "the distribution's, as AMD's install guide sets it."],
          "preferences": [{"packages": ["*"], "pin": "origin repo.radeon.com", "priority": 600},
                          {"packages": ["*"], "pin": "origin mirror.example", "priority": 600}]}], "ok"),
    "an arm64 node and a mapping without arm64": (
        "aarch64", "nvidia_container_toolkit",
        [{"name": "t-noarm", "variable": "nvidia_container_toolkit_apt_repository",
          "url": {"amd64": "{base}/cuda/x86_64/"}, "signed_by": KEYRING}],
        ["Refuse a repository that cannot work (before anything changes): nvidia_container_toolkit refuses:",
         "nvidia_container_toolkit_apt_repository.url names no repository for this node's architecture arm64 "
         "(it names amd64): add arm64:"]),
    "neither key_url nor signed_by": (
        "x86_64", "nvidia_driver",
        [{"name": "t-nokey", "variable": "nvidia_driver_apt_repository", "url": "{base}/cuda/x86_64/"}],
        ["Refuse a repository that cannot work (before anything changes): nvidia_driver refuses:",
         "nvidia_driver_apt_repository needs either `key_url`", "or `signed_by`"]),
    # Written as is, the line break would add a line of its own to the deb822 source.
    "a url with a line break": (
        "x86_64", "docker_engine",
        [{"name": "t-inject", "variable": "docker_engine_apt_repository", "url": "{base}/debian\nTrusted: yes",
          "suite": "bookworm", "signed_by": KEYRING}],
        ["Refuse a repository that cannot work (before anything changes): docker_engine refuses:",
         "docker_engine_apt_repository needs an http(s) `url` with no spaces or line breaks"]),
    "a flat repository with components": (
        "x86_64", "nvidia_driver",
        [{"name": "t-flatcomp", "variable": "nvidia_driver_apt_repository", "url": "{base}/cuda/x86_64/",
          "components": ["main"], "signed_by": KEYRING}],
        ["Refuse a repository that cannot work (before anything changes): nvidia_driver refuses:",
         "nvidia_driver_apt_repository.suite \"/\" is a flat repository's path, which has no components"]),
    "a key at its pinned fingerprint (the caller's default pin)": (
        "x86_64", "docker_engine",
        [{"name": "t-keyok", "variable": "docker_engine_apt_repository", "url": "{base}/debian", "suite": "bookworm",
          "key_url": "{base}/keys/docker.asc", "default_key_fingerprints": [DOCKER_FPR]}], "ok"),
    # Both keys are checked before either is written: the first (pinned) is not fetched either.
    "the second of two keys is not at its pinned fingerprint": (
        "x86_64", "amd_rocm",
        [{"name": "t-keyfirst", "variable": "amd_rocm_apt_repositories.amdgpu", "url": "{base}/debian",
          "suite": "bookworm", "key_url": "{base}/keys/docker.asc", "key_fingerprints": [DOCKER_FPR]},
         {"name": "t-keysecond", "variable": "amd_rocm_apt_repositories.rocm", "url": "{base}/debian",
          "suite": "bookworm", "key_url": "{base}/keys/docker.asc",
          "key_fingerprints": ["EB693B3035CD5710E231E123A4B469963BF863CC"],
          "default_key_fingerprints": [DOCKER_FPR]}],
        ["Refuse a signing key that is not pinned or cannot be fetched (before anything changes): amd_rocm "
         "refuses: The signing key served at {base}/keys/docker.asc is not trusted: primary key(s) "
         + DOCKER_FPR + " not pinned (pinned: EB693B3035CD5710E231E123A4B469963BF863CC)",
         "add it to amd_rocm_apt_repositories.rocm.key_fingerprints"]),
    # The first answers, the second does not: the refusal names only the second's variable.
    "the one of two repositories that does not answer": (
        "x86_64", "amd_rocm",
        [{"name": "t-alive", "variable": "amd_rocm_apt_repositories.amdgpu", "url": "{base}/debian",
          "suite": "bookworm", "components": ["main"], "signed_by": KEYRING},
         {"name": "t-dead", "variable": "amd_rocm_apt_repositories.rocm", "url": "{base}/rocm/apt/7.2",
          "suite": "jammy", "components": ["main"], "signed_by": KEYRING}],
        ["Refuse a repository that does not answer: amd_rocm refuses: The apt repository {base}/rocm/apt/7.2 did "
         "not answer within 3 s ({base}/rocm/apt/7.2/dists/jammy/Release: status 404",
         "Set amd_rocm_apt_repositories.rocm.url to a reachable mirror"]),
}
CASE_TASKS = """
- name: The node's architecture
  ansible.builtin.set_fact:
    ansible_facts: "{{ ansible_facts | combine({'architecture': case.arch}) }}"
- name: The role
  ansible.builtin.include_role:
    name: apt_repository
  vars:
    apt_repository_caller: "{{ case.caller }}"
    apt_repository_timeout: 3
    apt_repository_entries: "{{ case.entries }}"
"""


def _with_base(value, base):
    """The value with {base} replaced by the server's URL, through lists and mappings."""
    if isinstance(value, str):
        return value.replace("{base}", base)
    if isinstance(value, list):
        return [_with_base(item, base) for item in value]
    if isinstance(value, dict):
        return {key: _with_base(item, base) for key, item in value.items()}
    return value


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """{case: outcome}, {file name: text the role would write}, and the server's base URL."""
    tmp = tmp_path_factory.mktemp("apt_repository")
    with http_files(dict(SERVED)) as base:
        cases = [{"arch": arch, "caller": caller, "entries": _with_base(entries, base)}
                 for arch, caller, entries, _ in CASES.values()]
        runner, text, said = run_cases(tmp, CASE_TASKS, cases, cmdline="--check --diff")
    assert runner.rc == 0, text[-3000:]
    outcomes = dict(zip(CASES, said))
    written = {}
    for event in runner.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_item_on_ok" and data.get("task") in (SOURCES_TASK, PREF_TASK, KEY_TASK):
            entry = data["res"]["__apt_repository_entry"]
            if data["task"] == KEY_TASK:
                written[entry["keyring"]] = data["res"]["fingerprints"]
            elif data["task"] == SOURCES_TASK:
                written[entry["name"] + ".sources"] = data["res"]["diff"][0]["after"]
            else:
                written[entry["preferences_name"] + ".pref"] = data["res"]["diff"][0]["after"]
    return outcomes, written, base


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] == "ok"])
def test_accepted(run, name):
    assert run[0][name] == "ok", run[0][name]


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] != "ok"])
def test_refused_before_anything_changes_naming_the_callers_variable(run, name):
    said = run[0][name]
    for phrase in CASES[name][3]:
        assert phrase.replace("{base}", run[2]) in said, said


def test_each_architecture_gets_its_own_path(run):
    _, written, base = run
    assert written["t-x86.sources"] == (
        "# Managed by Ansible (nvidia_container_toolkit)\nTypes: deb\nURIs: %s/cuda/x86_64/\nSuites: /\n"
        "Signed-By: %s\n" % (base, KEYRING))
    assert written["t-arm.sources"] == written["t-x86.sources"].replace("/cuda/x86_64/", "/cuda/sbsa/")


def test_a_suite_source_has_its_components(run):
    _, written, base = run
    assert written["t-suite.sources"] == (
        "# Managed by Ansible (docker_engine)\nTypes: deb\nURIs: %s/debian\nSuites: bookworm\n"
        "Components: main contrib\nSigned-By: %s\n" % (base, KEYRING))


def test_the_preferences_are_the_old_templates_bytes(run):
    _, written, _ = run
    assert written["t-nvidia-driver.pref"] == GOLDEN_NVIDIA_PREF
    assert written["t-amd.pref"] == GOLDEN_AMD_PREF


def test_a_pinned_key_goes_to_the_entrys_keyring_and_signs_its_source(run):
    _, written, base = run
    assert written["/etc/apt/keyrings/t-keyok.asc"] == [DOCKER_FPR]
    assert "Signed-By: /etc/apt/keyrings/t-keyok.asc\n" in written["t-keyok.sources"]


def test_nothing_is_written_for_a_refused_entry(run):
    _, written, _ = run
    assert not {"t-noarm.sources", "t-nokey.sources", "t-inject.sources", "t-flatcomp.sources",
                "t-alive.sources", "t-dead.sources", "t-keyfirst.sources", "t-keysecond.sources",
                "/etc/apt/keyrings/t-keyfirst.asc", "/etc/apt/keyrings/t-keysecond.asc"} & set(written)
