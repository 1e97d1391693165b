"""The one policy-spec parser: round trips, errors naming the spec, and the periodic schedule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rift_ada.collectors.collect import CollectSettings, resolve_closed_policy
from rift_ada.collectors.probe_traces import ARM_FULL, ARM_STAT
from rift_ada.controller import DEFAULT_SCHEDULE, Controller
from rift_ada.policies.evaluate import resolve_policy_spec
from rift_ada.policies.replay import named_policy_controller
from rift_ada.policy_spec import CONTROLLER, DYN, PERIODIC, STAT, PolicySpec, parse, periodic_label


@pytest.mark.parametrize(
    ("text", "kind", "interval"),
    [
        ("stat", STAT, None),
        ("full", "full", None),
        ("swa", "swa", None),
        ("h2o", "h2o", None),
        ("triattention", "triattention", None),
        ("periodic:64", PERIODIC, 64),
        ("periodic:1", PERIODIC, 1),
        ("dyn:128", DYN, 128),
        ("runs/cell/controller.json", CONTROLLER, None),
    ],
)
def test_parse_and_label_round_trip(text: str, kind: str, interval: int | None) -> None:
    spec = parse(text)
    assert spec.kind == kind and spec.interval == interval
    assert spec.label == text
    assert parse(spec.label) == spec
    assert parse(spec) is spec


def test_aliases_and_spellings_normalise_in_the_label() -> None:
    assert parse("rift-stat") == PolicySpec(STAT) and parse("rift-stat").label == "stat"
    assert parse("periodic:064").label == "periodic:64"
    assert parse("dyn:64").as_periodic() == parse("periodic:64")
    assert parse("stat").as_periodic() == parse("stat")
    assert periodic_label(96) == "periodic:96" == PolicySpec.periodic(96).label
    # the probe arms' names are the specs' names
    assert (parse(ARM_STAT).kind, parse(ARM_FULL).kind) == (ARM_STAT, ARM_FULL)


def test_controller_files_are_paths_or_json_names(tmp_path: Path) -> None:
    existing = tmp_path / "gate"  # an existing file without the suffix is a controller file too
    existing.write_text("{}")
    assert parse(str(existing)) == PolicySpec(CONTROLLER, path=str(existing))
    assert parse(existing).path == str(existing)  # a path object is always a controller file
    assert parse("missing.json").kind == CONTROLLER  # loading it is the caller's step
    assert parse("periodic:8").replayable and parse("missing.json").replayable and not parse("snapkv").replayable


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sometimes", "unknown policy 'sometimes': use one of stat, full, swa"),
        ("periodic", "unknown policy 'periodic'"),
        ("periodic:0", r"policy 'periodic:0': the interval must be an integer >= 1 \(e.g. periodic:64\)"),
        ("dyn:-4", r"policy 'dyn:-4': the interval must be an integer >= 1 \(e.g. dyn:64\)"),
        ("periodic:", "policy 'periodic:': the interval"),
        ("periodic:1.5", "policy 'periodic:1.5': the interval"),
        ("periodic:²", "policy 'periodic:²': the interval"),  # a unicode digit int() refuses
        ("", "unknown policy ''"),
    ],
)
def test_bad_specs_name_the_spec(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_bad_spec_objects_are_refused() -> None:
    with pytest.raises(TypeError, match="policy spec must be a string or a path, got int"):
        parse(64)  # type: ignore[arg-type]
    for fields, message in [
        ({"kind": PERIODIC}, "interval must be an integer >= 1, got None"),
        ({"kind": PERIODIC, "interval": 0}, "interval must be an integer >= 1, got 0"),
        ({"kind": PERIODIC, "interval": True}, "interval must be an integer >= 1, got True"),
        ({"kind": STAT, "interval": 8}, "policy 'stat' takes no interval"),
        ({"kind": STAT, "path": "a.json"}, "policy 'stat' takes no path"),
        ({"kind": CONTROLLER}, "path must be a non-empty string"),
        ({"kind": "sometimes"}, "unknown policy kind 'sometimes'"),
    ]:
        with pytest.raises(ValueError, match=message):
            PolicySpec(**fields)
    with pytest.raises(ValueError, match="policy 'stat' has no refresh interval"):
        parse("stat").schedule()


@pytest.mark.parametrize("interval", [1, 16, 767, 768, 769, 2000])
def test_max_age_derivation_is_shared_by_replay_and_the_closed_loop(interval: int) -> None:
    default = DEFAULT_SCHEDULE["max_age"]
    assert default == 768
    expected = {"min_age": 0, "max_age": max(768, interval)}  # independent of the module's arithmetic
    assert parse(f"periodic:{interval}").schedule() == expected
    replayed = named_policy_controller(f"periodic:{interval}")
    assert replayed is not None and replayed["name"] == f"periodic:{interval}"
    assert {key: replayed["schedule"][key] for key in expected} == expected
    assert replayed["schedule"]["decision_stride"] == DEFAULT_SCHEDULE["decision_stride"]
    assert replayed["policy"] == {"kind": "periodic", "interval": interval}
    settings = CollectSettings(draft="d", target="t", decision_stride=4, budget=64, obs_window=8)
    closed = resolve_closed_policy(f"dyn:{interval}", settings)
    assert closed.label == f"periodic:{interval}" and closed.controller["name"] == f"dyn:{interval}"
    assert closed.controller["schedule"] == {"decision_stride": 4, **expected}
    assert closed.controller["policy"] == replayed["policy"]
    assert closed.controller["cache"] == settings.cache_json()
    Controller.from_dict(closed.controller)  # valid controller JSON


def test_callers_route_through_the_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert named_policy_controller("stat") is None and named_policy_controller("full") is None
    with pytest.raises(ValueError, match="policy 'swa' is not a named replay policy"):
        named_policy_controller("swa")
    assert resolve_policy_spec("dyn:32") == ("dyn:32", "dyn:32", "named")
    with pytest.raises(ValueError, match="policy 'h2o' runs in the closed loop only"):
        resolve_policy_spec("h2o")
    settings = CollectSettings(draft="d", target="t", budget=64, obs_window=8)
    assert resolve_closed_policy("rift-stat", settings).label == "stat"
    assert resolve_closed_policy("triattention", settings).controller["schedule"]["max_age"] == 768
    with pytest.raises(ValueError, match="unknown policy 'periodic'"):
        resolve_closed_policy("periodic", settings)
    with pytest.raises(ValueError, match=r"unknown policy 'gone\.json': no such controller file"):
        resolve_closed_policy("gone.json", settings)
    (tmp_path / "stat").write_text("{}")  # a file named like a policy does not shadow it
    assert resolve_policy_spec("stat") == ("stat", "stat", "named")


def test_the_parser_imports_only_the_standard_library() -> None:
    """A serving stack reads specs beside the Controller: no numpy, torch or transformers behind it."""
    heavy = "('numpy', 'torch', 'transformers')"
    code = f"import sys, rift_ada.policy_spec; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
