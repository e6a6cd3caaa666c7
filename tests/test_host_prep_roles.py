"""Static checks of the host-preparation roles (nvidia_driver, nvidia_container_toolkit,
amd_rocm, preflight, gpu_kernel): inputs documented in argument_specs match defaults, every distribution
named in the issue has its vars file, and prepare.yml chooses the GPU roles by data."""
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = ["nvidia_driver", "nvidia_container_toolkit", "amd_rocm", "preflight"]


def load(*parts):
    with open(os.path.join(ROOT, *parts)) as fh:
        return yaml.safe_load(fh)


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_cover_the_defaults(role):
    defaults = load("roles", role, "defaults", "main.yml")
    options = load("roles", role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options) - {"serving_spec"}
    for name, value in defaults.items():
        assert options[name].get("default") == value, name
        assert name.startswith(role + "_"), name


def test_gpu_kernel_argument_specs_cover_its_defaults():
    """gpu_kernel has entry points, no main: every default is documented, with its value, in the
    entry point that reads it, and nothing else is defaulted there."""
    defaults = load("roles", "gpu_kernel", "defaults", "main.yml")
    specs = load("roles", "gpu_kernel", "meta", "argument_specs.yml")["argument_specs"]
    assert set(specs) == {"prepare", "headers", "reboot"}
    documented = {}
    for entry in specs.values():
        for name, option in entry["options"].items():
            if "default" in option:
                documented[name] = option["default"]
    assert documented == defaults
    assert all(name.startswith("gpu_kernel_") for name in defaults)


@pytest.mark.parametrize("role", ["nvidia_driver", "amd_rocm"])
def test_both_vendors_reboot_through_gpu_kernel(role):
    """One reboot for both vendors (control node, units stopped, one node at a time): each vendor
    role includes gpu_kernel's three entry points and keeps no reboot of its own."""
    tasks_dir = os.path.join(ROOT, "roles", role, "tasks")
    text = "".join(open(os.path.join(tasks_dir, name)).read() for name in os.listdir(tasks_dir))
    for entry in ("prepare", "headers", "reboot"):
        assert "tasks_from: %s" % entry in text, entry
    assert "ansible.builtin.reboot" not in text


@pytest.mark.parametrize("role", ["nvidia_driver", "amd_rocm"])
@pytest.mark.parametrize("distro", ["Debian-12", "Ubuntu-22.04", "Ubuntu-24.04"])
def test_every_distribution_has_its_vars(role, distro):
    data = load("roles", role, "vars", distro + ".yml")
    repos = data.get("__nvidia_driver_default_repository") or data.get("__amd_rocm_default_repositories")
    assert repos, distro


def test_prepare_chooses_gpu_roles_by_vendor_data():
    plays = load("playbooks", "prepare.yml")
    play = plays[1]  # plays[0] only gathers every node's facts
    assert play["hosts"] == "nodes"
    assert play["roles"][0] == {"role": "serving"}
    assert set(play["vars"]["prepare_gpu_roles"]) == {"nvidia", "amd", "cpu"}
    names = [t.get("ansible.builtin.include_role", {}).get("name") for t in play["tasks"]]
    assert names[1:3] == ["preflight", "docker_engine"] and names[-2] == "preflight"
    gpu = [t for t in play["tasks"] if "loop" in t][0]
    assert "gpu" in gpu["tags"] and gpu["ansible.builtin.include_role"]["apply"]["tags"] == ["gpu"]
    assert "when" not in gpu
    # the burn-in gate comes last, after the second preflight, chosen by the same vendor data; its
    # settings (and dcgmi) are checked first, before anything changes
    burnin, validate = play["tasks"][-1], play["tasks"][0]
    assert burnin["ansible.builtin.include_role"]["name"] == "{{ prepare_burnin_role }}"
    assert burnin["loop"] == "{{ prepare_burnin_selected }}"
    assert validate["ansible.builtin.include_role"]["name"] == "gpu_burnin"
    assert validate["ansible.builtin.include_role"]["tasks_from"] == "validate"
    assert validate["when"] == "'gpu_burnin' in prepare_burnin_selected"
    assert set(play["vars"]["prepare_burnin_roles"]) == set(play["vars"]["prepare_gpu_roles"])
    assert play["vars"]["prepare_burnin_roles"]["nvidia"] == ["gpu_burnin"]
    assert "gpu" in burnin["tags"] and "when" not in burnin


def test_prepare_rolls_in_batches_and_the_molecule_drill_batches_the_same():
    """prepare.yml prepares the nodes in serial batches and stops at the first failure, so a driver
    reboot or a Docker restart never takes more than one batch down; molecule/nvidia_host's rolling
    drill (rolling.yml) uses the same keywords, so what it proves holds for prepare.yml."""
    plays = load("playbooks", "prepare.yml")
    facts, prepare = plays[0], plays[1]
    assert facts["gather_facts"] is True and "serial" not in facts
    assert prepare["serial"] == "{{ prepare_serial | default(1) }}"
    assert prepare["max_fail_percentage"] == 0
    drill = load("molecule", "nvidia_host", "rolling.yml")[0]
    assert (drill["serial"], drill["max_fail_percentage"]) == (prepare["serial"], prepare["max_fail_percentage"])


def _role_files(role, parts=("tasks", "templates", "handlers", "defaults", "vars")):
    """(path, text) of a role's YAML and Jinja files under `parts` (comments and all)."""
    for part in parts:
        for dirpath, _, names in os.walk(os.path.join(ROOT, "roles", role, part)):
            for name in names:
                if name.endswith((".yml", ".j2")):
                    path = os.path.join(dirpath, name)
                    with open(path) as fh:
                        yield path, fh.read()


def test_the_apt_repository_pattern_has_one_home():
    """Issue 35: the probe of a Release file, apt_signing_key and the deb822 source and
    preferences files live in roles/apt_repository only; the vendor roles include it with their
    own variables. A copy coming back into a role's tasks or templates fails here."""
    copies = []
    for role in sorted(os.listdir(os.path.join(ROOT, "roles"))):
        if role == "apt_repository":
            continue
        for path, text in _role_files(role, ("tasks", "templates", "handlers")):
            for needle in ("apt_signing_key", "sources.list.d", "preferences.d", "/Release"):
                if needle in text:
                    copies.append("%s: %s" % (os.path.relpath(path, ROOT), needle))
    assert not copies, copies
    for role in ("docker_engine", "nvidia_driver", "nvidia_container_toolkit", "amd_rocm"):
        text = "".join(text for _, text in _role_files(role, ("tasks",)))
        assert "name: apt_repository" in text, role


def test_no_role_reads_another_roles_private_variables():
    """A role's __<role>_ variables are its own: another role that reads them (as the monitoring
    roles read gateway's __gateway_apply_* before roles/service_apply) breaks when they change.
    Each __name is owned by the role with the longest name it starts with."""
    import re
    roles = sorted(os.listdir(os.path.join(ROOT, "roles")), key=len, reverse=True)
    found = []
    for role in roles:
        for path, text in _role_files(role):
            for name in set(re.findall(r"\b__([a-z0-9_]+)", text)):
                owner = next((r for r in roles if name.startswith(r + "_")), role)
                if owner != role:
                    found.append("%s reads __%s (%s's)" % (os.path.relpath(path, ROOT), name, owner))
    assert not found, found
