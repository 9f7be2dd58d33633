"""The drift rules: image, instance type and lifetime, from what is known of the worker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetkeeper.domain.drift import DRIFT_STATUSES, drift_of, expires_at
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import (
    MAX_LIFETIME_HOURS,
    DesiredLaunch,
    Drift,
    DriftReason,
    TemplateSpec,
    Worker,
    WorkerTemplate,
)

NOW = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)
TEMPLATE = WorkerTemplate(name="lab", instance_type="m5.large", ami_name_filter="lab-*", capacity=4)


def worker(**changes: object) -> Worker:
    base = Worker(
        id="w-1",
        template="lab",
        region="us-east-1",
        capacity=4,
        status=WorkerStatus.RUNNING,
        ec2_instance_id="i-1",
        image_id="ami-old",
        instance_type="m5.large",
        launched_at=NOW - timedelta(hours=2),
        created_at=NOW - timedelta(hours=3),
    )
    return base.model_copy(update=changes)


def test_given_a_worker_as_its_template_launches_now_then_it_has_no_drift():
    assert drift_of(worker(), TEMPLATE, "ami-old", NOW) is None


def test_given_a_newer_image_then_the_drift_is_image_and_names_what_is_desired():
    drift = drift_of(worker(), TEMPLATE, "ami-new", NOW)

    assert drift == Drift(
        reasons=[DriftReason.IMAGE],
        desired=DesiredLaunch(image_id="ami-new", instance_type="m5.large"),
        since=NOW,
    )


def test_given_another_instance_type_on_the_template_then_the_drift_is_instance_type():
    template = TEMPLATE.model_copy(update={"instance_type": "m5.xlarge"})

    drift = drift_of(worker(), template, "ami-old", NOW)

    assert drift is not None
    assert drift.reasons == [DriftReason.INSTANCE_TYPE]
    assert drift.desired.instance_type == "m5.xlarge"


def test_given_a_lifetime_passed_then_the_drift_is_expired_since_the_moment_it_expired():
    template = TEMPLATE.model_copy(update={"max_lifetime_hours": 1})

    drift = drift_of(worker(), template, "ami-old", NOW)

    assert drift is not None
    assert drift.reasons == [DriftReason.EXPIRED]
    assert drift.since == NOW - timedelta(hours=1)


def test_given_an_older_worker_without_launch_facts_then_only_its_age_from_creation_counts():
    older = worker(image_id=None, instance_type=None, launched_at=None)
    template = TEMPLATE.model_copy(update={"instance_type": "m5.xlarge", "max_lifetime_hours": 3})

    drift = drift_of(older, template, "ami-new", NOW)

    assert drift is not None
    assert drift.reasons == [DriftReason.EXPIRED]
    assert expires_at(older, template) == NOW


def test_given_no_image_matching_the_filter_then_no_image_drift_is_stated():
    assert drift_of(worker(), TEMPLATE, None, NOW) is None


@pytest.mark.parametrize("status", sorted(set(WorkerStatus) - DRIFT_STATUSES))
def test_given_a_worker_without_a_machine_then_it_has_no_drift(status: WorkerStatus):
    template = TEMPLATE.model_copy(update={"instance_type": "m5.xlarge", "max_lifetime_hours": 1})

    assert drift_of(worker(status=status), template, "ami-new", NOW) is None


def test_given_a_recorded_drift_then_its_since_is_kept_so_an_unchanged_drift_compares_equal():
    first = drift_of(worker(), TEMPLATE, "ami-new", NOW - timedelta(minutes=5))
    again = drift_of(worker(drift=first), TEMPLATE, "ami-new", NOW)

    assert again == first


@pytest.mark.parametrize("hours", [0, -1, MAX_LIFETIME_HOURS + 1])
def test_given_a_lifetime_out_of_range_then_the_template_is_refused_naming_it(hours: int):
    with pytest.raises(ValidationError) as refused:
        TemplateSpec(instance_type="m5.large", ami_name_filter="lab-*", capacity=1, max_lifetime_hours=hours)

    assert refused.value.errors()[0]["loc"] == ("max_lifetime_hours",)


_images = st.sampled_from(["ami-a", "ami-b", None])
_types = st.sampled_from(["m5.large", "m5.xlarge", None])


@given(
    running=_images,
    desired=_images,
    launched_type=_types,
    template_type=st.sampled_from(["m5.large", "m5.xlarge"]),
    age_minutes=st.integers(min_value=0, max_value=MAX_LIFETIME_HOURS * 60 * 2),
    lifetime=st.none() | st.integers(min_value=1, max_value=MAX_LIFETIME_HOURS),
    launched=st.booleans(),
)
def test_each_reason_is_reported_exactly_when_its_rule_holds(
    *,
    running: str | None,
    desired: str | None,
    launched_type: str | None,
    template_type: str,
    age_minutes: int,
    lifetime: int | None,
    launched: bool,
):
    born = NOW - timedelta(minutes=age_minutes)
    subject = worker(
        image_id=running,
        instance_type=launched_type,
        launched_at=born if launched else None,
        created_at=born,
    )
    template = TEMPLATE.model_copy(update={"instance_type": template_type, "max_lifetime_hours": lifetime})

    drift = drift_of(subject, template, desired, NOW)

    expected = []
    if running is not None and desired is not None and running != desired:
        expected.append(DriftReason.IMAGE)
    if launched_type is not None and launched_type != template_type:
        expected.append(DriftReason.INSTANCE_TYPE)
    if lifetime is not None and age_minutes >= lifetime * 60:
        expected.append(DriftReason.EXPIRED)
    assert (drift.reasons if drift else []) == expected
    if drift is not None:
        assert drift.desired == DesiredLaunch(image_id=desired, instance_type=template_type)
        assert drift.since <= NOW
