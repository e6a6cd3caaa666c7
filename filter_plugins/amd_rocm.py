# -*- coding: utf-8 -*-
"""Filters of the `amd_rocm` role.

Pure functions; tests/unit/test_amd_rocm.py checks them against the package versions and `dkms
status` lines recorded from AMD's repositories and real hosts
(tests/standin/fixtures/amd-rocm-repo.Packages).
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

# "1:6.16.13.30300000-2278356.22.04": epoch, module version, the driver release as 8 digits
# (30.30.0 -> 30300000), then the build number and the distribution.
_AMDGPU_DKMS = re.compile(r"^(?:\d+:)?(\d+\.\d+\.\d+)\.\d{8}-(\d+\.\d+\.\d+)$")


def dkms_version(package_version):
    """The version DKMS registers amdgpu under, from amdgpu-dkms's package version:
    "1:6.16.13.30300000-2278356.24.04" -> "6.16.13-2278356.24.04", as `dkms status` prints
    "amdgpu/6.16.13-2278356.24.04, 6.1.0-43-amd64, x86_64: installed" (ROCm/ROCm#6031)."""
    match = _AMDGPU_DKMS.match(str(package_version).strip())
    if not match:
        raise AnsibleFilterError("amd_rocm: %r is not an amdgpu-dkms version (like 1:6.16.13.30300000-2278356.22.04)"
                                 % (package_version,))
    return "%s-%s" % match.groups()


class FilterModule:
    def filters(self):
        return {"amd_rocm_dkms_version": dkms_version}
