"""Helpers both host-state files of molecule/nvidia_host use."""
import pytest


@pytest.fixture
def dkms_line(host):
    """`dkms status -m MODULE -k <running kernel>` on the host, after checking that the kernel's
    headers (what DKMS builds against) are installed; returns (kernel, the line)."""
    def read(module):
        kernel = host.check_output("uname -r")
        assert host.package("linux-headers-" + kernel).is_installed
        return kernel, host.check_output("dkms status -m %s -k %s", module, kernel)
    return read
