"""The one place Logger, Tracer and Metrics are created."""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger, Metrics, Tracer

# Each stage sets POWERTOOLS_SERVICE_NAME and POWERTOOLS_METRICS_NAMESPACE; the defaults serve local runs.
SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "fleetkeeper")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "fleetkeeper")

logger = Logger(service=SERVICE)
tracer = Tracer(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
