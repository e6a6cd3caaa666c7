"""filter_plugins/preflight.py: the one disk formula the plan prints and the node's check enforces."""
import os

from helpers import ROOT, load_source

preflight = load_source("mm3_preflight_filters", os.path.join(ROOT, "filter_plugins", "preflight.py"))


def test_a_fresh_node_needs_weights_image_and_margin():
    # b200: 444 GB of weights, the 40 GB image, the 50 GB margin (roles/preflight/defaults)
    assert preflight.disk_need(444, 40, 50) == {"weights_gb": 444.0, "need_gb": 534.0, "change_gb": 978.0}


def test_what_is_already_there_is_not_asked_for_again():
    assert preflight.disk_need(444, 40, 50, have_gb=400.04) == {
        "weights_gb": 44.0, "need_gb": 134.0, "change_gb": 578.0}
    # more than the revision's size already there (other files): never a negative need
    assert preflight.disk_need(444, 40, 50, have_gb=500)["weights_gb"] == 0.0


def test_unknown_sizes_count_as_zero():
    assert preflight.disk_need(None, "40", "50") == {"weights_gb": 0.0, "need_gb": 90.0, "change_gb": 90.0}
