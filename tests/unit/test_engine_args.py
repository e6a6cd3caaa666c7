"""engine_args (mm3.shared module_utils) reads an argument list the way the engine's argparse reads
it, over the engines' recorded argument lists (roles/serving/files/engine_args/*.json).

The truth is the engines themselves: each recorded list carries `probes`, the argument lists its
real parser was given when it was recorded (tools/engine_args/dump_parser.py) and what that parser
made of them (the values it stored, or the error it printed). Every probe is replayed here: what
the engine accepted must canonicalize to the same values (with a problem only for the forms the
project refuses although the engine takes them: abbreviations, repeats, vLLM's dotted form), and
what the engine refused must be a problem here too. The other cases pin every form on both lists."""
import json
import pathlib

import pytest
import yaml

from ansible_collections.mm3.shared.plugins.module_utils import engine_args as ea

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "serving" / "files" / "engine_args"
VARS = yaml.safe_load((ROOT / "roles" / "serving" / "vars" / "main.yml").read_text())
ENGINES = VARS["serving_engines"]
RECORDS = {engine: json.loads((FILES / facts["argparse"]["file"]).read_text()) for engine, facts in ENGINES.items()}
TABLES = {engine: ea.table(record) for engine, record in RECORDS.items()}
# What the project puts before the site's flags, so the positionals are where the engine has them.
LEAD = {"vllm": ["/models/m"], "sglang": ["--model-path", "/models/m"]}
# Forms the engine accepts and the project refuses (the probes show the engine taking them).
REFUSED_THOUGH_ACCEPTED = {"abbreviation", "duplicate", "dotted"}


def parse(engine, tokens, **kw):
    kw.setdefault("accepted_abbreviations", ENGINES[engine]["argparse"].get("abbreviations") or [])
    return ea.canonicalize(LEAD[engine] + tokens, TABLES[engine], **kw)


def last_values(occurrences):
    """{dest: value} as argparse leaves it: the last occurrence of each dest."""
    return {o["dest"]: o for o in occurrences if o["option"]}


def probe_cases():
    return [pytest.param(engine, probe, id="%s:%s" % (engine, " ".join(probe["argv"]))[:80])
            for engine, record in RECORDS.items() for probe in record["probes"]]


def test_every_engine_has_a_recorded_list_with_its_source():
    for engine, record in RECORDS.items():
        source = record["source"]
        assert source["engine"] == engine and source["version"] and source["stands_for"]
        assert record["parser"]["allow_abbrev"] is True  # both engines: prefixes are real
        assert len(record["actions"]) > 300 and len(record["probes"]) > 20
    assert RECORDS["vllm"]["parser"]["class"] == "FlexibleArgumentParser"
    assert RECORDS["sglang"]["source"]["server_args_py_blob_sha"]


@pytest.mark.parametrize("engine,probe", probe_cases())
def test_the_engines_own_answers_are_reproduced(engine, probe):
    occurrences, problems = parse(engine, probe["argv"], accepted_abbreviations=[])
    if "error" in probe:
        assert problems, (probe, occurrences)
        return
    kinds = {p["kind"] for p in problems}
    assert kinds <= REFUSED_THOUGH_ACCEPTED, (probe, problems)
    values = last_values(occurrences)
    options = {a["dest"]: a for a in RECORDS[engine]["actions"]}
    for dest, stored in probe["set"].items():
        if dest in ("model_tag", "model_path") and dest not in values:
            continue  # the positional / lead this test puts first
        if dest not in values:
            assert "dotted" in kinds, (probe, dest)  # vLLM merged it into the base option's JSON
            continue
        value = values[dest]["value"]
        if isinstance(value, bool):
            assert repr(value) == stored, (probe, dest)
        elif isinstance(value, list):
            assert [str(v) for v in eval(stored)] == value, (probe, dest)  # noqa: S307 - a recorded repr
        elif options[dest]["type"] in ("int", "float"):
            assert float(value) == float(stored), (probe, dest)
        elif options[dest]["type"] == "str" or options[dest]["type"] is None:
            assert repr(value) == stored, (probe, dest)
    # and nothing the engine left at its default is reported as set
    for dest, occurrence in values.items():
        default = options[dest]["default"]
        assert dest in probe["set"] or repr(occurrence["value"]) == default or dest == "model_path", (probe, dest)


@pytest.mark.parametrize("engine,tokens,dest,value,form", [
    ("sglang", ["--mem-fraction-static=0.5"], "mem_fraction_static", "0.5", "equals"),
    ("sglang", ["--tensor-parallel-size", "4"], "tp_size", "4", "exact"),
    ("sglang", ["--tp", "4"], "tp_size", "4", "accepted abbreviation"),
    ("sglang", ["--chunked-prefill-size", "-1"], "chunked_prefill_size", "-1", "exact"),
    ("sglang", ["--skip-server-warmup"], "skip_server_warmup", True, "exact"),
    ("vllm", ["-tp", "4"], "tensor_parallel_size", "4", "exact"),
    ("vllm", ["-tp=4"], "tensor_parallel_size", "4", "equals"),
    ("vllm", ["-q", "fp8"], "quantization", "fp8", "exact"),
    ("vllm", ["-qfp8"], "quantization", "fp8", "attached"),
    ("vllm", ["--tensor_parallel_size", "4"], "tensor_parallel_size", "4", "exact, rewritten"),
    ("vllm", ["--max_model_len=4096"], "max_model_len", "4096", "equals, rewritten"),
    ("vllm", ["-O3"], "optimization_level", "3", "exact, rewritten"),
    ("vllm", ["--no-enable-log-requests"], "enable_log_requests", False, "exact"),
    ("vllm", ["--enable-log-requests"], "enable_log_requests", True, "exact"),
    ("vllm", ["--api-key", "a", "b"], "api_key", ["a", "b"], "exact"),
    ("vllm", ["--allowed-media-domains", "a.example"], "allowed_media_domains", ["a.example"], "exact"),
])
def test_forms_canonicalize_to_the_dest_the_engine_stores(engine, tokens, dest, value, form):
    occurrences, problems = parse(engine, tokens)
    assert problems == []
    occurrence = last_values(occurrences)[dest]
    assert (occurrence["value"], occurrence["form"]) == (value, form)


@pytest.mark.parametrize("engine,tokens,kind,fragment", [
    ("sglang", ["--mem-fraction-stat", "0.5"], "abbreviation",
     "--mem-fraction-stat abbreviates --mem-fraction-static (the engine accepts a unique prefix): write "
     "--mem-fraction-static"),
    ("sglang", ["--tp-s", "8"], "abbreviation", "--tp-s abbreviates --tp-size"),
    ("sglang", ["--log-request"], "ambiguous", "--log-request is ambiguous: the engine could read it as "
     "--log-requests, --log-requests-format"),
    ("sglang", ["--tp", "8", "--tp-size", "4"], "duplicate", "--tp-size sets --tp-size, which --tp already set"),
    ("sglang", ["--model", "/x"], "duplicate", "--model sets --model-path, which --model-path already set"),
    ("vllm", ["--model", "/x"], "moved", "vLLM moves --model to the front as the positional model"),
    ("sglang", ["--model-path=/y"], "duplicate", "--model-path sets --model-path, which --model-path already set"),
    ("sglang", ["--tp_size", "4"], "unknown", "--tp_size is not an option of sglang 0.5.23"),
    ("sglang", ["--reasoning-parser"], "missing", "--reasoning-parser needs a value and has none"),
    ("sglang", ["--attention-backend", "fa9"], "choice", "--attention-backend fa9 is not one of the engine's choices"),
    ("sglang", ["--enable-metrics=yes"], "explicit", "--enable-metrics takes no value"),
    ("sglang", ["--skip-server-warmup", "extra"], "stray", "'extra' follows no option that takes it"),
    ("vllm", ["--tensor-parallel", "4"], "abbreviation", "--tensor-parallel abbreviates --tensor-parallel-size"),
    ("vllm", ["-t", "4"], "abbreviation", "-t abbreviates --tensor-parallel-size"),
    ("vllm", ["--enable-log-req"], "abbreviation", "--enable-log-req abbreviates --enable-log-requests"),
    ("vllm", ["--enable-log"], "ambiguous", "--enable-log is ambiguous"),
    ("vllm", ["--tensor-parallel-size", "8", "-tp", "4"], "duplicate",
     "-tp sets --tensor-parallel-size, which --tensor-parallel-size already set"),
    ("vllm", ["--enable-auto-tool-choice", "--no-enable-auto-tool-choice"], "duplicate",
     "--no-enable-auto-tool-choice sets --enable-auto-tool-choice"),
    ("vllm", ["--max-model-len.x", "1"], "dotted", "give --max-model-len its whole JSON value"),
    ("vllm", ["-tp4"], "unknown", "-tp4 is not an option of vllm 0.32.0"),
    ("vllm", ["--block-size"], "missing", "--block-size needs a value"),
    ("vllm", ["--allowed-media-domains"], "missing", "--allowed-media-domains needs a value"),
    ("vllm", ["--", "--enforce-eager"], "separator", "'--' makes the engine read every later argument"),
])
def test_each_problem_is_named(engine, tokens, kind, fragment):
    _, problems = parse(engine, tokens)
    assert [p for p in problems if p["kind"] == kind and fragment in p["message"]], problems


def test_origins_travel_with_occurrences_and_problems():
    tokens = ["--model-path", "/m", "--tp", "8", "--tp-size", "4"]
    occurrences, problems = ea.canonicalize(tokens, TABLES["sglang"], ["project"] * 2 + ["matrix"] * 2 + ["site"] * 2,
                                            accepted_abbreviations=["--tp"])
    assert [o["origin"] for o in occurrences if o["option"]] == ["project", "matrix", "site"]
    assert problems[0]["origin"] == "site" and "already set" in problems[0]["message"]
    assert "in matrix" in problems[0]["message"]


def test_an_accepted_abbreviation_must_stay_unique():
    """--tp is accepted only because the recorded list resolves it to one option: add an option
    that shares the prefix and the same token is ambiguous."""
    record = json.loads(json.dumps(RECORDS["sglang"]))
    record["actions"].append(dict(record["actions"][-1], option_strings=["--tp-other"], dest="tp_other"))
    _, problems = ea.canonicalize(["--tp", "8"], ea.table(record), accepted_abbreviations=["--tp"])
    assert [p["kind"] for p in problems] == ["ambiguous"]
    assert ea.dest_of("--tp", ea.table(record), ["--tp"]) is None
    assert ea.dest_of("--tp", TABLES["sglang"], ["--tp"]) == "tp_size"
    assert ea.dest_of("--tp", TABLES["sglang"]) is None


def test_without_allow_abbrev_a_prefix_is_unknown():
    record = json.loads(json.dumps(RECORDS["sglang"]))
    record["parser"]["allow_abbrev"] = False
    _, problems = ea.canonicalize(["--mem-fraction-stat", "0.5"], ea.table(record))
    assert [p["kind"] for p in problems] == ["unknown"]


def matrix_flags():
    """Every flag the project itself writes, per engine: the matrix entries', the presets', the
    engines' own command, model, served-name, metrics, media, required and logging flags."""
    flags = {engine: set() for engine in ENGINES}
    for entry in VARS["serving_matrix"].values():
        for engine, facts in (entry.get("engines") or {}).items():
            flags[engine] |= {a[0] for a in facts.get("args") or []}
    for preset in VARS["serving_tuning_presets"].values():
        flags["sglang"] |= set(preset)
    for engine, facts in ENGINES.items():
        flags[engine] |= {t for t in facts["command"][2:]} | set(facts.get("metrics_args") or [])
        flags[engine] |= {f for f in (facts.get("model_arg"), facts.get("served_model_name_arg"),
                                      facts.get("media_domains_flag")) if f}
        for listed in (facts.get("required_flags") or {}).values():
            flags[engine] |= set(listed)
        flags[engine] |= set(facts.get("request_logging_flags") or []) | set(facts["argparse"].get("protected") or [])
        flags[engine] |= {"--host", "--port"}
    return flags


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_flag_the_project_writes_is_in_its_engines_recorded_list(engine):
    accepted = ENGINES[engine]["argparse"].get("abbreviations") or []
    assert sorted(f for f in matrix_flags()[engine] if ea.dest_of(f, TABLES[engine], accepted) is None) == []


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_matrix_entry_canonicalizes_clean(engine):
    """The matrix's own flags, values included (choices), as the engine reads them."""
    for name, entry in VARS["serving_matrix"].items():
        facts = (entry.get("engines") or {}).get(engine)
        if not facts:
            continue
        tokens = [str(t) for a in facts["args"] for t in a]
        _, problems = parse(engine, tokens)
        assert problems == [], (name, problems)


def test_a_flag_the_engine_does_not_know_is_refused_even_from_the_matrix():
    """The check above fails for a matrix flag outside the recorded list (what it guards)."""
    _, problems = parse("sglang", ["--block-size", "128"])
    assert [p["kind"] for p in problems] == ["unknown"]
