"""What `make run` caches between starts, and what it says about it: the IAM template (rebuilt only when
its inputs change, saying which) and DynamoDB Local's class archive."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from fleetkeeper_local import dynamodb_jvm
from fleetkeeper_local.__main__ import Synthesis
from fleetkeeper_local.iam import policies
from fleetkeeper_local.stack import dynamodb_local_dir


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A clone holding only what the template is synthesized from."""
    for name, text in {
        "infra/stack.py": "STACK = 1\n",
        "infra/statemachines/drain.asl.json": "{}\n",
        "cdk.json": "{}\n",
        "local/fleetkeeper_local/iam/synth.py": "\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def synthesized(root: Path, seconds: float) -> None:
    """What a synthesis leaves: the template of the current inputs and its manifest."""
    state = policies.template_state(root)
    state.path.parent.mkdir(parents=True, exist_ok=True)
    state.path.write_text("{}")
    manifest = {"inputs": policies.template_inputs(root), "seconds": seconds}
    state.path.with_name(state.path.name.replace(".template.json", ".inputs.json")).write_text(
        json.dumps(manifest)
    )


def test_given_no_synthesis_yet_then_one_is_needed_and_estimated(clone: Path):
    state = policies.template_state(clone)

    assert (state.cached, state.why) == (False, "no synthesis recorded here yet")
    assert state.estimate_seconds == policies.FIRST_SYNTHESIS_ESTIMATE_SECONDS
    assert Synthesis(state).left(300).startswith("longer than the 40 s it takes on a quiet machine")


def test_given_a_synthesis_then_it_is_cached_until_an_input_changes_and_the_change_is_named(clone: Path):
    synthesized(clone, seconds=21.5)
    assert policies.template_state(clone).cached

    (clone / "infra" / "stack.py").write_text("STACK = 2\n")
    state = policies.template_state(clone)

    assert (state.cached, state.why, state.estimate_seconds) == (False, "infra/stack.py changed", 21.5)
    for name in ("cdk.json", "infra/new.py", "infra/other.py"):
        (clone / name).write_text("changed\n")
    assert policies.template_state(clone).why.startswith("4 inputs changed (cdk.json, infra/new.py, ...")


def test_given_a_synthesis_under_way_then_it_says_about_how_long_is_left(clone: Path):
    synthesized(clone, seconds=30)
    (clone / "cdk.json").write_text('{"context": {}}\n')
    synthesis = Synthesis(policies.template_state(clone))

    assert synthesis.what() == "synthesizing the dev stage's policies (cdk.json changed)"
    assert synthesis.left(12) == "about 18 s left"
    assert synthesis.left(45) == "longer than the 30 s the last one took"


def test_given_no_class_archive_then_the_jvm_lists_its_classes_and_later_ones_map_the_archive(tmp_path: Path):
    jar_dir = dynamodb_local_dir()

    first = dynamodb_jvm.launch(tmp_path, "java", jar_dir, ["-port", "8000"])
    first.archive.write_bytes(b"archive")
    later = dynamodb_jvm.launch(tmp_path, "java", jar_dir, ["-port", "8000"])

    assert first.class_list is not None
    assert f"-XX:DumpLoadedClassList={first.class_list}" in first.argv
    assert later.class_list is None
    assert f"-XX:SharedArchiveFile={first.archive}" in later.argv
    # An archive needs a class path of jars alone: the runner's manifest names no folder.
    runner = Path(later.class_path.split(":")[0])
    with zipfile.ZipFile(runner) as jar:
        assert "Class-Path" not in jar.read("META-INF/MANIFEST.MF").decode()
    assert all(part.endswith(".jar") for part in later.class_path.split(":"))
