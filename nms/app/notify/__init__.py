"""Notifications: incident events -> durable, retrying deliveries to the configured sinks.

Sinks (webhook, pagerduty, slack, alertmanager, servicenow; one module each) are found by kind
through the `nms.notifiers` entry points; `dispatcher.Notifier` owns the outbox and the worker.
"""

from nms.app.notify.base import HttpRequest, Sink
from nms.app.notify.dispatcher import NOTIFIER_GROUP, Notifier, SinkInfo

__all__ = ["NOTIFIER_GROUP", "HttpRequest", "Notifier", "Sink", "SinkInfo"]
