"""Who may call the internal routes: IAM roles and users named by ARN, a role also as its sessions."""

from __future__ import annotations

import pytest

from fleetkeeper.api.principal import is_one_of, principal_of, session_name

GC_ROLE = "arn:aws:iam::123456789012:role/platform/fleetkeeper-gc"
ADMIN_USER = "arn:aws:iam::123456789012:user/fleet-admin-tool"
TOOLING = (GC_ROLE, ADMIN_USER)


@pytest.mark.parametrize(
    "caller",
    [
        # API Gateway's userArn for a caller who assumed the role: the session, without the role's path.
        "arn:aws:sts::123456789012:assumed-role/fleetkeeper-gc/nightly-gc",
        GC_ROLE,
        "arn:aws:iam::123456789012:role/fleetkeeper-gc",
        ADMIN_USER,
    ],
)
def test_given_the_tooling_role_or_user_then_the_caller_is_one_of_them(caller):
    assert is_one_of(caller, TOOLING)


@pytest.mark.parametrize(
    "caller",
    [
        "arn:aws:sts::210987654321:assumed-role/fleetkeeper-gc/nightly-gc",  # another account
        "arn:aws:sts::123456789012:assumed-role/fleetkeeper-gc-2/s",
        "arn:aws:sts::123456789012:assumed-role/operator/fleetkeeper-gc",  # the session name is not a role
        "arn:aws:iam::123456789012:user/fleetkeeper-gc",  # a user is not the role of that name
        "arn:aws-cn:iam::123456789012:user/fleet-admin-tool",  # another partition
        "arn:aws:iam::123456789012:root",
        "arn:aws:sts::123456789012:federated-user/fleetkeeper-gc",
        "fleetkeeper-gc",
        "unknown-caller",
        "",
    ],
)
def test_given_anyone_else_then_the_caller_is_not_one_of_them(caller):
    assert not is_one_of(caller, TOOLING)


def test_given_no_tooling_principals_then_nobody_is_one_of_them():
    assert not is_one_of(GC_ROLE, ())


def test_given_a_role_arn_then_its_path_is_not_part_of_who_it_is():
    assert principal_of(GC_ROLE) == ("aws", "123456789012", "role", "fleetkeeper-gc")


@pytest.mark.parametrize(
    ("caller", "session"),
    [
        # An instance profile's session is named after its instance.
        (
            "arn:aws:sts::123456789012:assumed-role/fleetkeeper-agent/i-0123456789abcdef0",
            "i-0123456789abcdef0",
        ),
        ("arn:aws:iam::123456789012:role/fleetkeeper-agent", None),
        (ADMIN_USER, None),
    ],
)
def test_a_role_session_is_named_and_nothing_else_has_a_session(caller: str, session: str | None) -> None:
    assert session_name(caller) == session
