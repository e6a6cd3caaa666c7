"""gpu_kernel's Secure Boot check (roles/gpu_kernel/tasks/prepare.yml) run by ansible-runner on
the controller, with a stand-in efivar (Secure Boot on) and the stand-in mokutil (tests/standin/
bin/mokutil, replaying lcp/mokutil's strings; no UEFI exists here): the certificate it asks about
is the one DKMS signs with, read where DKMS reads it - mok_certificate= in framework.conf, then
framework.conf.d/*.conf, the last one set winning - and otherwise the distribution's default
(issue 36: an Ubuntu node whose DKMS signs with /var/lib/shim-signed/mok/MOK.der was told to
enroll /var/lib/dkms/mok.pub, which DKMS never uses there)."""
import os

from helpers import ROOT, run_cases

CASE = """
- name: The Secure Boot check as the vendor role includes it
  ansible.builtin.include_role:
    name: gpu_kernel
    tasks_from: prepare
  vars:
    gpu_kernel_caller: nvidia_driver
    gpu_kernel_module: nvidia
    gpu_kernel_secureboot_efivar: "{{ efivar }}"
    gpu_kernel_mokutil_command: ["{{ mokutil }}"]
    gpu_kernel_mok_certificate: "{{ case.cert }}"
    gpu_kernel_dkms_framework_conf: "{{ case.conf }}"
"""


def test_the_certificate_is_the_one_dkms_signs_with(tmp_path):
    efivar = tmp_path / "SecureBoot"
    efivar.write_bytes(b"\x06\x00\x00\x00\x01")
    plain = tmp_path / "plain" / "framework.conf"
    plain.parent.mkdir()
    plain.write_text('## DKMS configuration\n# mok_certificate="/var/lib/dkms/mok.pub"\n'
                     'mok_certificate="/srv/keys/site-mok.der"\n')
    layered = tmp_path / "layered" / "framework.conf"
    (tmp_path / "layered" / "framework.conf.d").mkdir(parents=True)
    layered.write_text("mok_certificate=/srv/keys/first.der\n")
    (tmp_path / "layered" / "framework.conf.d" / "10-site.conf").write_text("mok_certificate='/srv/keys/second.der'\n")
    cases = [
        {"cert": "", "conf": str(plain)},
        {"cert": "", "conf": str(layered)},
        {"cert": "", "conf": str(tmp_path / "none" / "framework.conf")},
        {"cert": "/srv/keys/set-here.der", "conf": str(plain)},
    ]
    runner, text, outcomes = run_cases(tmp_path, CASE, cases, play_vars={
        "efivar": str(efivar), "mokutil": os.path.join(ROOT, "tests", "standin", "bin", "mokutil")})
    assert runner.rc == 0, text[-2000:]
    named = ["mokutil --import /srv/keys/site-mok.der", "mokutil --import /srv/keys/second.der",
             # no configuration: this controller's distribution (Debian) default
             "mokutil --import /var/lib/dkms/mok.pub", "mokutil --import /srv/keys/set-here.der"]
    for outcome, phrase in zip(outcomes, named):
        assert "Secure Boot is on and the key DKMS signs" in outcome and phrase in outcome, outcome
    assert "what %s or the distribution names" % plain in outcomes[0]
    assert "this one is set there" in outcomes[3]
