"""Job metadata (hosts, NICs, ranks, start/end): what the correlator joins with fabric telemetry."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, require
from nms.app.binding import require_unbound
from nms.records import Job, TimestampNs

router = APIRouter(prefix="/jobs", tags=["jobs"], responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})


@router.post("", response_model=Job, status_code=201, dependencies=[Depends(require_unbound("ingest"))],
             responses={200: {"description": "an existing job was replaced", "model": Job}})
def put_job(job: Job, request: Request, response: Response) -> Job:
    created = request.app.state.service.state.put_job(job)
    if not created:
        response.status_code = 200
    return job


@router.get("", response_model=list[Job], dependencies=[Depends(require("read"))])
def list_jobs(request: Request,
              active_at: TimestampNs | None = Query(None, description="only jobs running at this time (ns or RFC 3339)"),
              host: str | None = Query(None, max_length=128, description="only jobs that use this host"),
              limit: int = Query(1000, ge=1, le=100_000)) -> list[Job]:
    return request.app.state.service.state.list_jobs(active_at=active_at, host=host, limit=limit)


@router.get("/{job_id}", response_model=Job, dependencies=[Depends(require("read"))],
            responses={404: {"description": "no such job"}})
def get_job(job_id: str, request: Request) -> Job:
    job = request.app.state.service.state.get_job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return job


@router.delete("/{job_id}", status_code=204, dependencies=[Depends(require_unbound("ingest"))],
               responses={404: {"description": "no such job"}})
def delete_job(job_id: str, request: Request) -> Response:
    if not request.app.state.service.state.delete_job(job_id):
        raise HTTPException(404, f"no job {job_id!r}")
    return Response(status_code=204)
