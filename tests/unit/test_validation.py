"""The one home of the project's input checks (mm3.shared validation.py): every filter, module,
Jinja test and the node's weights re-check import these, so each case here is the behaviour of
all of them. Each refused value has an accepted twin beside it, so a check that stopped checking
fails here."""
import ast
import pathlib

import pytest

from ansible_collections.mm3.shared.plugins.module_utils import validation as v

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("check,good,bad", [
    (v.is_git_commit, "c5454eb03678d8710e54a4e0fc681b9f3b4a3dba",
     ["c5454eb03678d8710e54a4e0fc681b9f3b4a3dba\n", "C5454EB03678D8710E54A4E0FC681B9F3B4A3DBA", "c5454eb", None, 5]),
    (v.is_sha256, "ab" * 32, ["ab" * 32 + "\n", "AB" * 32, "ab" * 31, "sha256:" + "ab" * 32, None]),
    (v.is_image_id, "sha256:" + "ab" * 32, ["sha256:" + "ab" * 32 + "\n", "ab" * 32, "sha512:" + "ab" * 64]),
    (v.is_digest_reference, "lmsysorg/sglang@sha256:" + "de" * 32,
     ["lmsysorg/sglang:latest", "--privileged@sha256:" + "de" * 32, "LMSYSORG/sglang@sha256:" + "de" * 32,
      "lmsysorg/sglang@sha256:" + "de" * 32 + "\n"]),
])
def test_pins_are_whole_and_lower_case(check, good, bad):
    assert check(good) is True
    for value in bad:
        assert check(value) is False, value


@pytest.mark.parametrize("repository,ok", [
    ("lmsysorg/sglang", True), ("vllm/vllm-openai", True), ("nvcr.io/nvidia/k8s/dcgm-exporter", True),
    ("registry.site.internal:5000/mirror/sglang", True), ("localhost/mm3-lab/vllm-cpu", True), ("ubuntu", True),
    ("a__b/c-d--e", True),
    # docker would read these as options, take a second token as the image, or refuse them
    ("--mount=type=bind,source=/,target=/host", False), ("--volume=/:/host", False),
    ("lmsysorg/sglang --privileged", False), ("LMSYSORG/SGLang", False), ("lmsysorg/sglang:latest", False),
    ("lmsysorg/sglang@sha256:" + "de" * 32, False), ("", False), ("a/", False), ("/a", False), ("a_-b", False),
])
def test_an_image_repository_is_read_as_docker_reads_one(repository, ok):
    assert v.is_image_repository(repository) is ok


@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("localhost", True), (" 127.0.0.1 ", True),
    ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("10.0.0.1", False), ("::", False), ("not-an-ip", False), (None, False), (127, False)])
def test_loopback(address, expected):
    assert v.is_loopback(address) is expected


@pytest.mark.parametrize("address,expected", [
    ("10.0.0.1", True), ("fd00::5", True), ("::", True),
    ("fe80::1%eth0", False), ("[::1]", False), (" 10.0.0.1", False), ("gpu01", False), (None, False), (1, False)])
def test_an_ip_is_a_bare_literal(address, expected):
    assert v.is_ip(address) is expected


def test_networks_one_reading_for_every_role():
    """gateway_metrics_networks is read by the gateway and, as monitoring_node_networks' default,
    by the node's exporters: one function, so ' 10.0.0.0/8' cannot be accepted by one and refused
    by the other."""
    assert v.networks([" 10.0.0.0/8", "10.20.30.40/16", "fd00::/8", "192.0.2.7"], "x") == (
        ["10.0.0.0/8", "10.20.0.0/16", "fd00::/8", "192.0.2.7/32"], [])
    nets, problems = v.networks(["10.0.0.0/33", "corp", 10, True], "gateway_allowed_networks")
    assert nets == [] and len(problems) == 4 and all("gateway_allowed_networks" in p for p in problems)
    assert v.networks("10.0.0.0/8", "x")[1] == ["x is a str: list networks in CIDR form, e.g. ['10.20.0.0/16']."]


def test_control_characters_in_values_and_keys():
    assert v.control_problems({"a": ["ok", {"b": "x\ny"}], "c\td": "ok", "e": 5}, "spec") == [
        "spec.a[1].b is 'x\\ny', which holds a control character (newline, tab, ...): it would break the "
        "file or the command line it reaches; write it on one line without them.",
        "spec has a key 'c\\td', which holds a control character (newline, tab, ...): it would break the "
        "file or the command line it reaches; write it on one line without them."]
    for ch in ("\x00", "\x1b", "\x7f", "\x85", "\u009f"):
        assert v.has_control("a" + ch) is True
    assert v.has_control("plain text, ünïcode") is False


@pytest.mark.parametrize("value,expected", [
    (8443, 8443), ("8443", 8443), (" 8443 ", 8443), (True, None), (0, None), (65536, None), ("84a3", None),
    (8443.0, None), (None, None)])
def test_ports(value, expected):
    assert v.port_problem(value, "gateway_port")[0] == expected
    if expected is None:
        assert v.port_problem(value, "gateway_port")[1].startswith("gateway_port is ")


def test_numbers_are_finite():
    assert v.number("0.65", 0, 1) == 0.65 and v.number(1, 0, 1) == 1
    for bad in ("nan", "inf", float("nan"), True, "0x10", None, 1.5):
        assert v.number(bad, 0, 1) is None, bad


@pytest.mark.parametrize("path,ok", [
    ("/data/models", True), ("/data/models/", True), ("/", True),
    ("data/models", False), ("/data/../etc", False), ("/data//models", False), ("/data/./models", False),
    ("/data/mo:dels", False), ("/data/mo,dels", False), ("/data/mo\ndels", False), ("", False), (None, False)])
def test_absolute_paths(path, ok):
    assert (v.absolute_path_problem(path, "serving_weights_root") is None) is ok


@pytest.mark.parametrize("key,needle", [
    ("d1b0f097958c6e6d76ac0f2ab027c460", None),  # openssl rand -hex 16
    ("<d1b0f097958c6e6d76ac0f2ab027c460>", None),  # < and > are characters a generator may give
    ("12345678901234567890123456789012", "is digits only"),
    ("9f2c4e81a7b3d6059f2c4e81a7b3d605", "repeats a pattern of 16 characters"),
    ("abcdefgh" * 4, "repeats a pattern of 8 characters"),
    ("abcdefgh" * 4 + "abc", "repeats a pattern of 8 characters"),
    ("short", "has 5 characters (at least 32)"),
    ("9f2c4e81a7b3d605 9f2c4e81a7b3d605", "whitespace or a control character"),
    ("changeme" + "9f2c4e81a7b3d605" * 2, "looks like a placeholder"),
    ("a" * 40, "looks like a placeholder"),
    (12345, "is a int, not a string"),
    (None, "is set but null"),
])
def test_secrets(key, needle):
    problem = v.secret_problem(key, "gateway client 'app' key", "set it to a random string")
    if needle is None:
        assert problem is None
    else:
        assert needle in problem and "set it to a random string" in problem
        assert str(key) not in problem or key is None or isinstance(key, int)


def test_the_type_name_of_an_ansible_string_is_str():
    """A refusal names 'str', never Ansible's internal tagged-string class."""
    from ansible.module_utils._internal._datatag import AnsibleTagHelper  # noqa: PLC0415
    from ansible._internal._datatag._tags import Origin  # noqa: PLC0415
    tagged = AnsibleTagHelper.tag("x", [Origin(path="/inventory.yml")])
    assert type(tagged).__name__ != "str" and v.type_name(tagged) == "str"


CHECK_PATTERNS = ["[0-9a-f]{40}", "[0-9a-f]{64}", r"[\x00-\x1f\x7f-\x9f]"]


def test_each_check_is_written_once():
    """The patterns of the checks above appear in validation.py and nowhere else in the project's
    code (filters, modules, shared code, roles, playbooks): a copy is how the checks drifted."""
    places = {}
    for folder in ("filter_plugins", "library", "test_plugins", "collections/ansible_collections/mm3",
                   "roles", "playbooks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".yml", ".j2") or not path.is_file():
                continue
            text = path.read_text()
            for pattern in CHECK_PATTERNS:
                if pattern in text:
                    places.setdefault(pattern, []).append(str(path.relative_to(ROOT)))
    own = "collections/ansible_collections/mm3/shared/plugins/module_utils/validation.py"
    assert places == {p: [own] for p in CHECK_PATTERNS}


def test_the_shared_module_needs_only_the_standard_library():
    """validation.py runs on a node without Ansible (the weights re-check imports it)."""
    tree = ast.parse(pathlib.Path(v.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "ipaddress", "posixpath", "re", "urllib"}


@pytest.mark.parametrize("path,ok", [
    ("MiniMaxAI/MiniMax-M3-MXFP8/" + "c5" * 20, True), ("org/tiny/" + "a" * 40, True),
    ("org/tiny/" + "a" * 39, False), ("org/" + "a" * 40, False), ("../tiny/" + "a" * 40, False),
    ("org/ti ny/" + "a" * 40, False), ("x/org/tiny/" + "a" * 40, False), (None, False)])
def test_revision_paths(path, ok):
    assert v.is_revision_path(path) is ok


def test_the_jinja_tests_are_the_shared_checks():
    """test_plugins/validation.py exposes the shared functions themselves, not copies."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mm3_test_plugins", ROOT / "test_plugins" / "validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.TestModule().tests() == {"mm3_git_commit": v.is_git_commit, "mm3_sha256": v.is_sha256,
                                           "mm3_image_id": v.is_image_id,
                                           "mm3_revision_path": v.is_revision_path,
                                           "mm3_protected_endpoint": v.is_protected_endpoint}


@pytest.mark.parametrize("url,ok", [
    ("https://huggingface.co", True), ("https://hub.mirror.internal:8443/", True),
    ("http://127.0.0.1:8090", True), ("http://localhost:8090", True), ("http://[::1]:8090", True),
    ("http://hub.mirror.internal", False), ("http://10.0.0.5:8090", False),
    ("https://user:pw@hub.internal", False), ("https://", False), ("ftp://127.0.0.1", False),
    ("https://hub.internal\n", False), ("https://hub .internal", False), (None, False),
    ("http://127.0.0.1.evil.example", False)])
def test_protected_endpoints(url, ok):
    assert v.is_protected_endpoint(url) is ok


def test_every_exported_filter_is_used():
    """A filter registered for the roles is called by a role, playbook, template or lab file: an
    export nobody calls is dead code that still has to be read and kept working."""
    import importlib.util
    import re
    used = ""
    for folder in ("roles", "playbooks", "lab", "molecule", "inventories", "tests/playbooks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".yml", ".j2") and path.is_file():
                used += path.read_text()
    unused = []
    for path in sorted((ROOT / "filter_plugins").glob("*.py")):
        spec = importlib.util.spec_from_file_location("mm3_dead_" + path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        unused += [name for name in module.FilterModule().filters() if not re.search(r"\b%s\b" % name, used)]
    assert unused == []


@pytest.mark.parametrize("value,word,url", [
    ("https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/", True, True),
    ("http://10.0.0.5:8080/mirror", True, True),
    ("https://mirror/x\nTrusted: yes", False, False), ("https://mirror /x", False, False),
    ("ftp://mirror/x", True, False), ("https://", True, False), ("stable", True, False), ("", False, False),
    (None, False, False), ("https://a\u0085b", False, False)])
def test_words_and_urls_for_one_line_of_a_file(value, word, url):
    assert v.is_word(value) is word and v.is_http_url(value) is url


@pytest.mark.parametrize("address,needle", [
    ("127.0.0.1", None), ("0.0.0.0", None), ("::", None), ("::1", None), ("10.1.2.3", None), ("fd00::5", None),
    ("fe80::1%eth0", "is not an IP address"), ("fe80::1", "is a link-local address"),
    ("224.0.0.1", "is a multicast address"), ("ff02::1", "is a multicast address"),
    ("255.255.255.255", "is a broadcast address"), ("localhost", "is not an IP address")])
def test_bind_addresses(address, needle):
    problem = v.bind_address_problem(address, "serving_bind_address")
    assert (problem is None) if needle is None else (needle in problem and "serving_bind_address" in problem)


def test_path_components_fit_linux():
    assert v.absolute_path_problem("/data/" + "m" * 255, "serving_weights_root") is None
    assert "a path component of 256 bytes" in v.absolute_path_problem("/data/" + "m" * 256, "serving_weights_root")
    # bytes, not characters: 128 two-byte characters are 256 bytes
    assert "256 bytes" in v.absolute_path_problem("/data/" + "\u00e9" * 128, "serving_weights_root")
    deep = "/" + "/".join(["d" * 200] * 21)
    assert "bytes long (Linux takes at most 4095)" in v.absolute_path_problem(deep, "serving_weights_root")
