"""Worker templates: what a worker runs on and how long its drains may take."""

from __future__ import annotations

from http import HTTPStatus

from aws_lambda_powertools.event_handler import Response

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import ResourceName
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import LeadTimeView, TemplateDetail, TemplateList, TemplateRequest, TemplateView
from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.launch import refused_instance_type
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.services import catalog
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.lead_time import lead_time

router = ResourceRouter(
    "templates",
    "What a worker runs on: instance type, image filter, capacity, drain timeout, tags, lifetime.",
)


@router.get(
    "/api/v1/templates",
    summary="List every template",
    description="Every template, in one answer (a stage has a handful).",
    responses=responses({200: ("every template", TemplateList)}),
)
def list_templates() -> TemplateList:
    return TemplateList(items=[TemplateView.of(t) for t in default_context().store.list_templates()])


@router.get(
    "/api/v1/templates/<name>",
    summary="Read a template",
    description="The template as stored, with its `lead_time`: how long its workers take from a launch, "
    "and from a start of a stopped worker, to RUNNING (p95 of the last 50 of each, or 10 and 2 minutes "
    "while fewer than 5 were measured). 404 if there is no such template.",
    responses=responses({200: ("the template", TemplateDetail)}, 404),
)
def get_template(name: ResourceName) -> TemplateDetail:
    context = default_context()
    return _detail(context, context.store.get_template(name))


def _detail(context: Context, template: WorkerTemplate) -> TemplateDetail:
    """The template as a read answers it: with its lead time."""
    lead = LeadTimeView.of(lead_time(template.name, context))
    return TemplateDetail(**TemplateView.of(template).model_dump(), lead_time=lead)


@router.put(
    "/api/v1/templates/<name>",
    summary="Create or replace a template",
    description="Writes the whole template: 201 when it is new, 200 when it replaced one. Workers launched "
    "from now on follow it; running workers that differ from it are drifted. 422 names a field of the "
    "wrong type or range, an `instance_type` the stage may not launch, a `before_stop` operation the "
    "stage does not offer, or a tag EC2 would refuse; 409 if another write replaced it meanwhile.",
    responses=responses(
        {200: ("the template, replaced", TemplateDetail), 201: ("the template, created", TemplateDetail)},
        409,
    ),
)
def put_template(name: ResourceName, body: TemplateRequest) -> Response[TemplateDetail]:
    context = default_context()
    # A before_stop name must be one of the stage's cleanup operations (422 naming before_stop.<i>).
    context.settings.operations_catalogue.check_before_stop(body.before_stop)
    # IAM lets the reconciler launch only the stage's instance types: refuse any other now, not at launch.
    refusal = refused_instance_type(body.instance_type, context.settings.instance_types)
    if refusal:
        raise InvalidInput("instance_type", refusal)
    store = context.store
    existed = store.find_template(name) is not None
    template = WorkerTemplate.model_validate({"name": name, **body.model_dump()})
    stored = catalog.put_template(store, template, actor=caller(router.current_event))
    status = HTTPStatus.OK if existed else HTTPStatus.CREATED
    return Response(status_code=status, content_type=JSON, body=_detail(context, stored))
