"""Templates' lead times: recorded when a worker comes up, read by whoever plans capacity ahead.

`record` is called by the two writers of a move to RUNNING (the reconcile step and the EC2 state-change
event), right after the move landed. A sample that cannot be written is logged and counted
(`LeadTimeSamplesLost`), never raised: the worker's own move is what matters, and the lead time only
rests on one sample less.
"""

from __future__ import annotations

from datetime import timedelta

from fleetkeeper.domain.lead_time import DEFAULT_LAUNCH, LeadTime, lead_time_of, sample_of
from fleetkeeper.domain.models import Worker
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services.context import Context, default_context

METRIC_SAMPLES_LOST = "LeadTimeSamplesLost"


def record(ctx: Context, before: Worker, after: Worker) -> bool:
    """Keep the sample the move from `before` to `after` yields, if any; False when it was lost."""
    sample = sample_of(before, after)
    if sample is None:
        return True
    kind, seconds = sample
    try:
        ctx.store.add_lead_sample(after.template, kind, seconds)
    except Exception:  # a lost sample must never fail the move that yielded it
        logger.exception("lead-time sample lost", worker_id=after.id, template=after.template, kind=str(kind))
        metrics.add_metric(name=METRIC_SAMPLES_LOST, unit="Count", value=1)
        return False
    return True


def lead_time(template_name: str, ctx: Context | None = None) -> LeadTime:
    """The template's launch and start lead times: measured, or the stated defaults."""
    samples = (ctx or default_context()).store.lead_samples(template_name)
    return lead_time_of(samples)


def launch_lead(template_name: str | None, ctx: Context | None = None) -> timedelta:
    """How long before a worker of the template is needed it must be asked for: its measured launch
    lead time (the p95 of its launches to RUNNING, or the stated default); the default without one."""
    if template_name is None:
        return DEFAULT_LAUNCH
    return timedelta(seconds=lead_time(template_name, ctx).launch_seconds)
