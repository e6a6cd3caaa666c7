"""Shared test helpers (pytest.ini puts tests/ on sys.path)."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_source(name, path):
    """Import a module or module_utils file by path under the name Ansible gives it
    (e.g. ansible.module_utils.weights_common), so the modules' own imports resolve."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
