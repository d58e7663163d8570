"""Job metadata (hosts, NICs, ranks, start/end): what the correlator joins with fabric telemetry."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from pydantic import BaseModel

from nms.app.api.deps import NcclJobsDep, StateDep, StoreDep
from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, require
from nms.app.binding import require_unbound
from nms.records import Job, JobSlowdown, NcclCollectivePerf, TimestampNs
from nms.state import StateStore
from nms.store import Query as StoreQuery

router = APIRouter(prefix="/jobs", tags=["jobs"], responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})


@router.post("", response_model=Job, status_code=201, dependencies=[Depends(require_unbound("ingest"))],
             responses={200: {"description": "an existing job was replaced", "model": Job}})
def put_job(job: Job, nccl_jobs: NcclJobsDep, state: StateDep, response: Response) -> Job:
    """Create or replace a job. A job the NCCL plugin's data already built is merged: what this body
    states wins, the plugin's ranks/QPs stay (docs/nccl_plugin.md, "Jobs"); the merged job is returned."""
    created = nccl_jobs.register(job)
    if not created:
        response.status_code = 200
    return state.get_job(job.id) or job


@router.get("", response_model=list[Job], dependencies=[Depends(require("read"))])
def list_jobs(
    state: StateDep,
    active_at: TimestampNs | None = Query(None, description="only jobs running at this time (ns or RFC 3339)"),
    host: str | None = Query(None, max_length=128, description="only jobs that use this host"),
    limit: int = Query(1000, ge=1, le=100_000),
) -> list[Job]:
    return state.list_jobs(active_at=active_at, host=host, limit=limit)


@router.get("/{job_id}", response_model=Job, dependencies=[Depends(require("read"))],
            responses={404: {"description": "no such job"}})
def get_job(job_id: str, state: StateDep) -> Job:
    job = state.get_job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return job


@router.delete("/{job_id}", status_code=204, dependencies=[Depends(require_unbound("ingest"))],
               responses={404: {"description": "no such job"}})
def delete_job(job_id: str, state: StateDep) -> Response:
    if not state.delete_job(job_id):
        raise HTTPException(404, f"no job {job_id!r}")
    return Response(status_code=204)


class JobSlowdowns(BaseModel):
    active: list[JobSlowdown] = []
    cleared: list[JobSlowdown] = []


def _job(state: StateStore, job_id: str) -> Job:
    job = state.get_job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return job


@router.get("/{job_id}/collectives", response_model=list[NcclCollectivePerf], dependencies=[Depends(require("read"))],
            responses={404: {"description": "no such job"}})
def job_collectives(job_id: str, state: StateDep, nccl_jobs: NcclJobsDep, store: StoreDep,
                    since: TimestampNs | None = Query(None, description="from this time (default: the job's start)"),
                    limit: int = Query(100, ge=1, le=10_000, description="the newest this many")) -> list:
    """The job's assembled collectives (duration, algbw, busbw, baseline, slow), oldest first."""
    job = _job(state, job_id)
    nccl_jobs.flush()
    start = since if since is not None else job.start
    end = time.time_ns() + 60 * 10**9
    span = 60 * 10**9
    while True:  # the store returns the oldest rows of a range: widen a range ending now until it holds `limit`
        lo = max(start, end - span)
        rows = _collectives(store, job_id, lo, end, limit)
        if len(rows) >= limit or lo == start:
            break
        span *= 8
    rows.sort(key=lambda c: (c.start_ns, c.comm_id))
    return rows[-limit:]


def _collectives(store, job_id: str, start: int, end: int, limit: int) -> list[NcclCollectivePerf]:
    rows = []
    for s in store.query(StoreQuery(measurement=NcclCollectivePerf.measurement, start=start, end=end,
                                    tags={"job_id": [job_id]}, limit=100_000)):
        for values in s.values[-limit:]:
            row = {**s.tags, **dict(zip(s.columns, values))}
            row["start_ns"] = row.pop("time")
            rows.append(NcclCollectivePerf.model_validate({k: v for k, v in row.items() if v is not None},
                                                          strict=False))
    return rows


@router.get("/{job_id}/slowdowns", response_model=JobSlowdowns, dependencies=[Depends(require("read"))],
            responses={404: {"description": "no such job"}})
def job_slowdowns(job_id: str, state: StateDep, nccl_jobs: NcclJobsDep) -> JobSlowdowns:
    """The job's collectives below their bus bandwidth baseline now, and the cleared ones the
    correlating process saw (kept in its memory: a restart forgets them; the series stays in the
    store). A cluster member that does not correlate serves what that member last shared (within
    a correlator step)."""
    _job(state, job_id)
    if not nccl_jobs.detects_here:
        shared = state.slowdowns(job_id)
        return JobSlowdowns() if shared is None else JobSlowdowns.model_validate_json(shared)
    active, cleared = nccl_jobs.slowdowns(job_id)
    return JobSlowdowns(active=active, cleared=cleared)
