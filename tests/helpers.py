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


MATRIX_FILE = os.path.join(ROOT, "roles", "serving", "vars", "main.yml")


def hardware_matrix():
    """serving_matrix as roles/serving/vars/main.yml holds it: the one list of profiles that
    every per-profile test derives its cases from (a new entry is tested by all of them at once)."""
    import yaml

    with open(MATRIX_FILE) as handle:
        return yaml.safe_load(handle)["serving_matrix"]


def matrix_profiles(engine=None, msa_warmup=None):
    """Profile names in matrix order: every entry, or those carrying flags for `engine`; with
    msa_warmup=True (False), only those whose `engine` entry sets msa_warmup (does not)."""
    names = []
    for name, entry in hardware_matrix().items():
        engines = entry.get("engines") or {}
        if engine is not None and engine not in engines:
            continue
        if msa_warmup is not None and bool(engines[engine].get("msa_warmup", False)) != msa_warmup:
            continue
        names.append(name)
    return names


def run_playbook(playbook, work_dir, extravars=None, inventory="localhost,", cmdline=None):
    """Run a playbook through ansible-runner (the design card's runner), with the project's
    ansible.cfg. Returns (runner, text): the runner's rc, status and events (structured
    per-host results) and the whole stdout with whitespace collapsed, for message checks.
    extravars travel typed (JSON), so booleans, nulls and lists reach the play as such."""
    import ansible_runner  # imported here: only the playbook tests need it

    private = os.path.join(os.fspath(work_dir), "runner")
    os.makedirs(private, exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=private,
        playbook=os.path.join(ROOT, playbook),
        project_dir=ROOT,
        inventory=inventory,
        extravars=extravars or {},
        cmdline=cmdline,
        envvars={"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                 "PATH": os.path.join(ROOT, ".venv", "bin") + os.pathsep + os.environ.get("PATH", "")},
        quiet=True,
        timeout=900,
    )
    text = " ".join(runner.stdout.read().split())
    return runner, text


def run_role_check(role, role_vars, work_dir):
    """Run one role against the controller itself in --check mode (a regression cannot change
    this machine; refusals must happen in read-only tasks). role_vars travel as JSON, which is
    YAML. Returns run_playbook's (runner, text)."""
    import json
    import pathlib

    play = pathlib.Path(work_dir) / "play.yml"
    play.write_text("- hosts: localhost\n  connection: local\n  gather_facts: true\n  roles:\n"
                    "    - role: %s\n      vars: %s\n" % (role, json.dumps(role_vars)))
    return run_playbook(str(play), work_dir, cmdline="--check",
                        extravars={"ansible_python_interpreter": sys.executable})


def run_cases(work_dir, case_tasks, cases, play_vars=None, cmdline=None):
    """Run every case in one playbook run against the controller (one run keeps the suite's
    minutes): `case_tasks` (YAML, a task list that reads the case as `case`) runs per case inside
    a block whose rescue keeps the refusal. Returns (runner, text, outcomes): per case in order,
    "ok" or "<failed task's name>: <its message>". play_vars are the play's vars (typed, as JSON)."""
    import json
    import pathlib

    import yaml

    work = pathlib.Path(work_dir)
    (work / "case.yml").write_text(json.dumps([{
        "name": "One case",
        "block": yaml.safe_load(case_tasks) + [
            {"name": "Not refused", "ansible.builtin.set_fact": {"outcome": "{{ outcome + ['ok'] }}"}}],
        "rescue": [{"name": "Refused", "ansible.builtin.set_fact": {
            "outcome": "{{ outcome + [ansible_failed_task.name ~ ': ' ~ ansible_failed_result.msg] }}"}}]}]))
    out = work / "out.json"
    (work / "play.yml").write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": True,
        "vars": dict(play_vars or {}, outcome=[]),
        "tasks": [
            {"name": "Every case", "ansible.builtin.include_tasks": "case.yml", "loop": "{{ cases }}",
             "loop_control": {"loop_var": "case"}},
            {"name": "Keep the outcomes", "ansible.builtin.copy": {
                "content": "{{ outcome | to_json }}", "dest": str(out), "mode": "0600"}, "check_mode": False}]}]))
    runner, text = run_playbook(str(work / "play.yml"), work, cmdline=cmdline, extravars={"cases": cases})
    return runner, text, json.loads(out.read_text()) if out.exists() else None


def failures(runner):
    """{task name: msg} of every failed task in a runner's events."""
    return {event["event_data"].get("task"): event["event_data"].get("res", {}).get("msg")
            for event in runner.events if event.get("event") == "runner_on_failed"}


def http_files(served):
    """A real HTTP server on 127.0.0.1 answering GET `path` with served[path] (bytes; the test
    may change the dict while it runs) and 404 otherwise. A context manager yielding its base
    URL (http://127.0.0.1:PORT); the server stops on exit."""
    import contextlib
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"not found")

        def log_message(self, *args):
            pass

    @contextlib.contextmanager
    def running():
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            yield "http://127.0.0.1:%d" % srv.server_address[1]
        finally:
            srv.shutdown()
            srv.server_close()

    return running()


def rsync_daemon(conf_dir, root, password, module_lines=""):
    """A real rsync daemon on loopback serving `root` as module `weights` the way
    roles/weights_sync's does (user `weights` with a password, read-only, only 127.0.0.1), plus
    module_lines. A context manager giving the port."""
    import contextlib
    import socket
    import subprocess
    import time

    @contextlib.contextmanager
    def running():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.makedirs(conf_dir, exist_ok=True)
        secrets = os.path.join(conf_dir, "rsyncd.secrets")
        with open(secrets, "w") as f:
            f.write("weights:%s\n" % password)
        os.chmod(secrets, 0o600)
        conf = os.path.join(conf_dir, "rsyncd.conf")
        with open(conf, "w") as f:
            f.write("use chroot = no\npid file = %s/rsyncd.pid\nlog file = %s/rsyncd.log\n"
                    "[weights]\npath = %s\nread only = yes\nuid = root\ngid = root\n"
                    "auth users = weights\nsecrets file = %s\nhosts allow = 127.0.0.1\nhosts deny = *\n%s"
                    % (conf_dir, conf_dir, root, secrets, module_lines))
        daemon = subprocess.Popen(["rsync", "--daemon", "--no-detach", "--address=127.0.0.1",
                                   "--port=%d" % port, "--config=%s" % conf])
        try:
            for _ in range(100):
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
            yield port
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)

    return running()



def serving_args(tables=None, **inputs):
    """serving_resolve's two arguments as roles/serving builds them: `inputs` over the role's
    defaults (defaults/main.yml, the one home of each default: serving_<name> -> <name>), and the
    hardware matrix's tables (vars/main.yml) with `tables` over them."""
    import yaml

    serving = load_source("mm3_serving_filters", os.path.join(ROOT, "filter_plugins", "serving.py"))
    role = os.path.join(ROOT, "roles", "serving")
    with open(os.path.join(role, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(role, "vars", "main.yml")) as handle:
        facts = yaml.safe_load(handle)
    merged = {name: defaults["serving_" + name] for name in serving.INPUTS if "serving_" + name in defaults}
    merged.update(inputs)
    table = {name: facts["serving_" + name] for name in serving.TABLES if name != "engine_args"}
    table["engine_args"] = engine_arg_lists(facts["serving_engines"])
    table.update(tables or {})
    return merged, table


def engine_arg_lists(engines):
    """{engine: its recorded argument list} as roles/serving/tasks/main.yml loads it
    (roles/serving/files/engine_args/<serving_engines.<engine>.argparse.file>)."""
    import json

    lists = {}
    for engine, facts in engines.items():
        with open(os.path.join(ROOT, "roles", "serving", "files", "engine_args", facts["argparse"]["file"])) as handle:
            lists[engine] = json.load(handle)
    return lists


def openssl_ec_keys(directory, names=("site", "stranger")):
    """{name: (private PEM bytes, public PEM text)} of EC P-256 keys made by openssl, as a site's
    security team makes release keys (docs/operations/releases.md)."""
    import subprocess

    out = {}
    for name in names:
        pem, pub = os.path.join(directory, name + ".pem"), os.path.join(directory, name + ".pub")
        subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", pem], check=True)
        subprocess.run(["openssl", "ec", "-in", pem, "-pubout", "-out", pub], check=True, capture_output=True)
        with open(pem, "rb") as private, open(pub) as public:
            out[name] = (private.read(), public.read())
    return out


def install_node_checks(libexec, scripts):
    """Lay out the unit's start checks (`scripts`: paths of roles/model_server/files/check_*.py)
    and the shared code they import under `libexec`, as role model_server installs them (filter
    model_server_helper_files): the installed form the unit runs."""
    import shutil

    ms_filters = load_source("model_server_filters", os.path.join(ROOT, "filter_plugins", "model_server.py"))
    os.makedirs(libexec, exist_ok=True)
    for script in scripts:
        shutil.copy(script, os.path.join(libexec, os.path.basename(script)))
    for item in ms_filters.helper_files(str(libexec)):
        os.makedirs(os.path.dirname(item["dest"]), exist_ok=True)
        if "src" in item:
            shutil.copy(item["src"], item["dest"])
        else:
            with open(item["dest"], "w") as handle:
                handle.write(item["content"])


# The two values a site must set before the Kubernetes objects render (and the signed release's
# check image), as an operator would: images by digest, the staging host's name.
K8S_SITE = {"model_server_k8s_prefill_image": "registry.example.internal/mm3/prefill@sha256:" + "d" * 64,
            "model_server_k8s_rsync_server": "staging.example.internal",
            "model_server_k8s_release_image": "registry.example.internal/mm3/release-check@sha256:" + "e" * 64}


def k8s_settings(**overrides):
    """__model_server_k8s_settings as role model_server_k8s builds it (vars/main.yml) from its
    defaults (defaults/main.yml) and K8S_SITE, then `overrides` (keys without the prefix)."""
    import copy

    import yaml

    role = os.path.join(ROOT, "roles", "model_server_k8s")
    with open(os.path.join(role, "defaults", "main.yml")) as handle:
        values = dict(yaml.safe_load(handle), **K8S_SITE)
    with open(os.path.join(role, "vars", "main.yml")) as handle:
        templates = yaml.safe_load(handle)["__model_server_k8s_settings"]
    out = {}
    for key, template in templates.items():
        name = str(template).strip("{} ")
        out[key] = copy.deepcopy(values[name]) if name in values else template
    out.update(overrides)
    return out


# What a Kubernetes API server admits of one object, as its source says (not as the filter under
# test says): a ConfigMap's data and binaryData, their lengths summed, at most core.MaxSecretSize
# (kubernetes pkg/apis/core/validation/validation.go, ValidateConfigMap); an object's annotations,
# keys and values summed, at most TotalAnnotationSizeLimitB (apimachinery
# pkg/api/validation/objectmeta.go, ValidateAnnotationsSize).
API_CONFIGMAP_MAX = 1 * 1024 * 1024
API_ANNOTATIONS_MAX = 256 * (1 << 10)


def applied_annotations_size(obj):
    """The bytes of `obj`'s annotations an API server counts once kubernetes.core.k8s (apply: true,
    as role model_server_k8s applies) has created it: the object merged with the collection's own
    annotate() (its last-applied record), as its apply_object does for a new object."""
    from ansible.module_utils.common.dict_transformations import dict_merge
    from ansible_collections.kubernetes.core.plugins.module_utils.apply import annotate
    annotations = dict_merge(obj, annotate(obj))["metadata"]["annotations"]
    return sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())
