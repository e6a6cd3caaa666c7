"""amd_rocm refuses a ROCm release it cannot install before anything changes: below the row's
floor, a release without a known amdgpu driver, a row without a default, a version that is not
digits and dots. The role runs against the controller in --check mode through ansible-runner; all
cases in one playbook run (each a rescued include), to keep the suite's minutes."""

import pytest
from helpers import run_cases

MI355X = {"profile": "mi355x", "gpu": {"vendor": "amd", "model": "MI355X", "count": 8, "rocm_floor": "7.2",
                                       "rocm_default": "7.2"}}
CASES = {
    "below the row's floor (the old single default on MI355X)": (
        {"amd_rocm_version": "7.0.2"}, MI355X,
        ["needs ROCm >= 7.2", "amd_rocm_version is '7.0.2' with amdgpu driver '30.10.2'",
         "Set amd_rocm_version to a release at or above the floor"]),
    "a release whose driver the role does not know": (
        {"amd_rocm_version": "7.2.0"}, MI355X,
        ["amd_rocm_version is '7.2.0' with amdgpu driver ''", "another release also needs amd_rocm_amdgpu_version"]),
    "a row without a ROCm default": (
        {}, dict(MI355X, gpu=dict(MI355X["gpu"], rocm_default=None)),
        ["amd_rocm_version is ''"]),
    "a version with a line after it (it would become a repository path)": (
        {"amd_rocm_version": "7.2\nX", "amd_rocm_amdgpu_version": "30.30"}, MI355X,
        ["needs ROCm >= 7.2"]),
    # A plain $ would accept it: Python's $ matches before a final newline.
    "a version ending in a newline": (
        {"amd_rocm_version": "7.2\n", "amd_rocm_amdgpu_version": "30.30"}, MI355X,
        ["needs ROCm >= 7.2"]),
}
CASE_TASKS = """
- name: The role, told a release
  ansible.builtin.include_role:
    name: amd_rocm
  vars:
    serving_spec: "{{ case.spec }}"
    amd_rocm_apt_repositories: "{{ loopback }}"
    amd_rocm_version: "{{ case.vars.amd_rocm_version }}"
    amd_rocm_amdgpu_version: "{{ case.vars.amd_rocm_amdgpu_version | default('') }}"
  when: case.vars.amd_rocm_version is defined
- name: The role, with its own default (the row's)
  ansible.builtin.include_role:
    name: amd_rocm
  vars:
    serving_spec: "{{ case.spec }}"
    amd_rocm_apt_repositories: "{{ loopback }}"
  when: case.vars.amd_rocm_version is not defined
"""
# Never AMD's servers: should a case get past the check, its repositories are a closed loopback port.
PLAY_VARS = {"loopback": {"amdgpu": {"url": "http://127.0.0.1:9/amdgpu/ubuntu"},
                          "rocm": {"url": "http://127.0.0.1:9/rocm/apt"}},
             "amd_rocm_apt_timeout": 2}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("amd")
    cases = [{"vars": v, "spec": spec} for v, spec, _ in CASES.values()]
    runner, text, said = run_cases(tmp, CASE_TASKS, cases, play_vars=PLAY_VARS, cmdline="--check")
    assert runner.rc == 0, text[-2000:]
    return dict(zip(CASES, said))


@pytest.mark.parametrize("name", CASES)
def test_refused_at_the_input_check_naming_the_fix(outcomes, name):
    said = outcomes[name]
    assert said.startswith("Refuse inputs that cannot work (before anything changes): amd_rocm refuses"), said
    for phrase in CASES[name][2]:
        assert phrase in said, said
