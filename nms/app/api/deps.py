"""Typed FastAPI dependencies: the parts of the service a handler uses, each its own `Annotated`
alias (`def h(state: StateDep)`). The service wires its parts (nms.app.service) and create_app puts
it on app.state; these providers are the one place in the API that reads it. None takes a query,
header or body parameter, so none changes a route's parameters or its OpenAPI schema."""

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from correlator.actions.manager import ActionManager
from correlator.incidents import IncidentManager
from correlator.jobs_nccl import NcclJobs
from nms.app.agent_registry import AgentRegistry
from nms.app.api.fabric_view import FabricViews
from nms.app.audits.runner import AuditRunner
from nms.app.audits.snapshot import SnapshotSource
from nms.app.clock_service import ClockService
from nms.app.metrics import ServiceMetrics
from nms.app.notify import Notifier
from nms.app.polling import Poller
from nms.app.telemetry_bus import TelemetryPublisher
from nms.config import NmsConfig
from nms.state import StateStore
from nms.store import TimeSeriesStore


def _service(request: Request):
    return request.app.state.service


async def get_config(request: Request) -> NmsConfig:
    return _service(request).config


async def get_store(request: Request) -> TimeSeriesStore:
    return _service(request).store


async def get_state(request: Request) -> StateStore:
    return _service(request).state


async def get_metrics(request: Request) -> ServiceMetrics:
    return _service(request).metrics


async def get_poller(request: Request) -> Poller:
    return _service(request).poller


async def get_clock(request: Request) -> ClockService:
    return _service(request).clock


async def get_incidents(request: Request) -> IncidentManager:
    return _service(request).incidents


async def get_actions(request: Request) -> ActionManager:
    return _service(request).actions


async def get_agents(request: Request) -> AgentRegistry:
    return _service(request).agents


async def get_audits(request: Request) -> AuditRunner:
    return _service(request).audits


async def get_audit_source(request: Request) -> SnapshotSource:
    return _service(request).audit_source


async def get_nccl_jobs(request: Request) -> NcclJobs:
    return _service(request).nccl_jobs


async def get_notifier(request: Request) -> Notifier:
    return _service(request).notifier


async def get_on_ingest(request: Request) -> Callable[[str, list], list]:
    """The service's hook for validated ingest records (clock sync, NCCL jobs, correlator)."""
    return _service(request).on_ingest


async def get_publisher(request: Request) -> TelemetryPublisher | None:
    """The telemetry bus publisher of a cluster's API (None: one process, ingest writes the store)."""
    return _service(request).publisher


async def get_started_at(request: Request) -> float:
    return _service(request).started_at


async def get_running(request: Request) -> Callable[[], bool]:
    """Whether the service is running (its scheduler started and not stopped): streams end when not."""
    service = _service(request)

    def running() -> bool:
        scheduler = service.scheduler  # set by Service.start, stopped by Service.stop
        return scheduler is not None and scheduler.running

    return running


async def get_fabric_views(request: Request) -> FabricViews:
    return request.app.state.fabric_views  # one per app (create_app), shared by every /fabric/stream


ConfigDep = Annotated[NmsConfig, Depends(get_config)]
StoreDep = Annotated[TimeSeriesStore, Depends(get_store)]
StateDep = Annotated[StateStore, Depends(get_state)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
PollerDep = Annotated[Poller, Depends(get_poller)]
ClockDep = Annotated[ClockService, Depends(get_clock)]
IncidentsDep = Annotated[IncidentManager, Depends(get_incidents)]
ActionsDep = Annotated[ActionManager, Depends(get_actions)]
AgentsDep = Annotated[AgentRegistry, Depends(get_agents)]
AuditsDep = Annotated[AuditRunner, Depends(get_audits)]
AuditSourceDep = Annotated[SnapshotSource, Depends(get_audit_source)]
NcclJobsDep = Annotated[NcclJobs, Depends(get_nccl_jobs)]
NotifierDep = Annotated[Notifier, Depends(get_notifier)]
OnIngestDep = Annotated[Callable[[str, list], list], Depends(get_on_ingest)]
PublisherDep = Annotated[TelemetryPublisher | None, Depends(get_publisher)]
StartedAtDep = Annotated[float, Depends(get_started_at)]
RunningDep = Annotated[Callable[[], bool], Depends(get_running)]
FabricViewsDep = Annotated[FabricViews, Depends(get_fabric_views)]
