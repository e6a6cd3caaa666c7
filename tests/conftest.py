"""Session fixtures shared by the test files.

`plans`: ONE run of playbooks/plan.yml for the whole session renders every variant the plan tests
read (tests/test_plan_golden.py, tests/test_k8s_manifests.py), each once, instead of one
ansible-playbook run per variant and test file. The run is a generated playbook that imports the
real playbooks/plan.yml once per (variant, profile), with the variant's inputs as that import's
vars (they override plan.yml's own play vars and the roles' defaults, like -e did; no -e is
given). Before each variant a one-task play empties plan_results, so plan.yml's "blocked" exit
judges each variant alone. Which profiles a variant renders comes from the hardware matrix
(helpers.matrix_profiles), never from a list here.
"""
import collections
import json
import pathlib

import pytest
from helpers import ROOT, hardware_matrix, matrix_profiles, run_playbook

PLAYBOOK = pathlib.Path(ROOT) / "playbooks" / "plan.yml"

# The seed's image digest (b200's in the matrix). The matrix publishes no digest for the other
# images; where a variant must pin one (Kubernetes pulls by digest or not at all), it is this
# stand-in, so that no plan shows the seed's CUDA image on an AMD or Hopper profile.
SEED_DIGEST = "sha256:de63ac56df5d7b064451e21147eaab89634a02332d830ca8c01cb8c033b3a78f"
STANDIN_DIGEST = "sha256:" + "e" * 64
# Every profile pinned the way playbooks/k8s.yml requires: an image digest, a weights revision
# (the BF16 repository has none in the matrix), a manifest pin, the pre-fill image and the
# staging daemon's address; the inferred rows acknowledged.
PINS = {"serving_allow_inferred": True, "serving_weights_revision": "b" * 40,
        "serving_weights_manifest_sha256": "c" * 64,
        "model_server_k8s_prefill_image": "registry.example.internal/mm3/prefill@sha256:" + "d" * 64,
        "model_server_k8s_rsync_server": "10.20.0.5"}
# Secret values the variants carry; no plan file and no output may show them.
K8S_KEY = "k8s-test-key-3f9a1c77e2-never-in-a-manifest"
RSYNC_PASSWORD = "k8s-test-rsync-password-9d2e-never-written"
PLAN_KEY = "plan-test-key-5d1e0b-never-in-a-plan"


def image_pin(profile, engine):
    """serving_image for a pinned plan of `profile` with `engine`: the matrix's digest where it
    has one (b200: the seed's), else the stand-in."""
    digest = hardware_matrix()[profile]["engines"][engine]["image"].get("digest")
    return {"digest": digest or STANDIN_DIGEST}


def pinned(profile, engine="sglang", **more):
    """The inputs of a fully pinned plan (unit and Kubernetes objects) of one profile."""
    return dict(PINS, serving_image=image_pin(profile, engine), serving_engine=engine, **more)


Variant = collections.namedtuple("Variant", "profiles inputs strict")
# name -> which profiles, each profile's inputs, strict: planned without plan_allow_blocked (the
# run fails when one of them is blocked). Order: the run's order.
VARIANTS = {
    # The bare matrix, as an operator plans it first: nothing is deployable as shipped (b200 lacks
    # only its manifest pin, which the first staging run prints for review).
    "defaults": Variant(matrix_profiles(), lambda profile: {}, False),
    # Every SGLang profile, pinned: the goldens, the units, the Kubernetes objects.
    "pinned": Variant(matrix_profiles("sglang"), lambda profile: pinned(profile), False),
    # Every vLLM profile, pinned, loopback without a key: the vLLM goldens.
    "pinned-vllm": Variant(matrix_profiles("vllm"), lambda profile: pinned(profile, "vllm"), False),
    # vLLM with an API key on a non-loopback bind: the engine reads it from its config file, which
    # the pod mounts from a Secret; the rsync password must not be written either.
    "keyed-vllm": Variant(matrix_profiles("vllm"), lambda profile: pinned(
        profile, "vllm", serving_api_key=K8S_KEY, weights_sync_password=RSYNC_PASSWORD,
        serving_bind_address="0.0.0.0"), False),
    # Tag families (no digest, acknowledged for a lab): a unit but no Kubernetes objects. h200
    # (no MSA) and b300 (MSA: the JIT cache is named IMAGE-ID until the node knows the image).
    "unpinned": Variant(["h200", "b300"], lambda profile: dict(
        PINS, serving_image={}, serving_allow_unpinned_image=True), False),
    # b200 as shipped with its manifest pinned and one site choice each; strict: an unblocked plan
    # exits 0.
    "ipv6": Variant(["b200"], lambda profile: {"serving_bind_address": "::1",
                                               "serving_weights_manifest_sha256": "c" * 64}, True),
    "keyed": Variant(["b200"], lambda profile: {"serving_bind_address": "0.0.0.0", "serving_api_key": PLAN_KEY,
                                                "serving_weights_manifest_sha256": "c" * 64}, True),
    # A profile name that walks out of plan_dir: plan_dir/../outside holds a file the plan must
    # leave alone (the fixture puts it there first).
    "traversal": Variant(["../outside"], lambda profile: {}, False),
}
# What the traversal variant's profile would reach: <root>/outside, beside the variants' plan dirs.
OUTSIDE_FILE = pathlib.PurePosixPath("outside") / "keep"


class PlanRun:
    """What the session's plan run left: `out` (the whole stdout, whitespace collapsed) and, per
    variant name, a Plan: `dir` (plan_dir: <dir>/<profile>/...), `out` (that variant's part of the
    output) and `inputs` (profile -> the vars it was planned with)."""

    Plan = collections.namedtuple("Plan", "dir out inputs strict")

    def __init__(self, root, out):
        self.root = root
        self.out = out
        self.outside = root / OUTSIDE_FILE  # the file the traversal variant must leave alone
        self.plans = {}
        parts = out.split("PLAY [plan variant: ")
        for name, variant in VARIANTS.items():
            part = next(p for p in parts if p.startswith(name + "]"))
            self.plans[name] = self.Plan(root / name, part, {p: variant.inputs(p) for p in variant.profiles},
                                         variant.strict)

    def __getitem__(self, name):
        return self.plans[name]


def plan_harness(root):
    """The generated playbook: per variant, a play that empties plan_results, then one import of
    playbooks/plan.yml per profile with the variant's inputs as the import's vars."""
    plays = []
    for name, variant in VARIANTS.items():
        plays.append({"name": "plan variant: " + name, "hosts": "localhost", "connection": "local",
                      "gather_facts": False, "tasks": [{
                          "name": "Start the variant's list of planned profiles from empty",
                          "ansible.builtin.set_fact": {"plan_results": []}}]})
        for profile in variant.profiles:
            plays.append({"ansible.builtin.import_playbook": str(PLAYBOOK),
                          "vars": dict(variant.inputs(profile), serving_profile=profile,
                                       plan_dir=str(root / name), plan_allow_blocked=not variant.strict)})
    return plays


@pytest.fixture(scope="session")
def plans(tmp_path_factory):
    """The session's one plan run (see the module's docstring)."""
    work = tmp_path_factory.mktemp("plans")
    root = work / "plan"
    harness = work / "harness" / "plan-variants.yml"
    harness.parent.mkdir()
    harness.write_text(json.dumps(plan_harness(root), indent=1))  # JSON is YAML; typed values stay typed
    (root / OUTSIDE_FILE).parent.mkdir(parents=True)
    (root / OUTSIDE_FILE).write_text("not the plan's\n")
    runner, out = run_playbook(str(harness), work / "runner")
    assert runner.rc == 0, out[-4000:]
    return PlanRun(root, out)


@pytest.fixture(scope="session")
def plan_pins():
    """pinned(): the inputs of a fully pinned plan of one profile (for runs of their own)."""
    return pinned
