"""The one place Logger, Tracer and Metrics are created."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

# Service name and metrics namespace come from POWERTOOLS_SERVICE_NAME / POWERTOOLS_METRICS_NAMESPACE.
logger = Logger(service="fleetkeeper")
tracer = Tracer(service="fleetkeeper")
metrics = Metrics(namespace="fleetkeeper", service="fleetkeeper")
