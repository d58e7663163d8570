"""GET /clock: the newest clock solution per host (service-side clock sync, nms.app.clock_service) and what
the last solve used. History is in the store: measurement `clock_solution` (and `clock_edge`). A cluster
member that does not solve (no `correlate`) shows the newest stored solutions, without solve counts."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from fastapi import Query as Param
from pydantic import BaseModel, Field

from nms.app.api.deps import ClockDep, ConfigDep
from nms.app.auth import AUTH_RESPONSES, require
from nms.app.clock_service import SolveStats

router = APIRouter(tags=["clock"], dependencies=[Depends(require("read"))], responses=AUTH_RESPONSES)


class HostClock(BaseModel):
    host: str
    window_start: int = Field(description="the solved slot's start, fabric time (ns)")
    offset_ns: float = Field(description="clock_host - fabric time at window_start")
    drift_ppb: float = Field(description="ns per second, relative to fabric time")
    bound_ns: float = Field(description="|error of clock_b - clock_a| <= bound_a + bound_b within the slot "
                                        "(hosts of one component; >= 99 % of pairs on the lab)")
    component: int | None = Field(None, description="connected component in its solve: offsets are comparable "
                                                    "only within one")
    age_s: float = Field(description="now - window_start")
    in_last_solve: bool = Field(description="part of the newest solve (only those correct probe windows)")


class ClockStatus(BaseModel):
    enabled: bool
    method: str
    window_s: float
    solve_lag_s: float
    max_age_s: float
    pending_edges: int = Field(description="edges of slots not solved yet")
    late_edges: int = Field(description="edges that came after their slot was solved (since start)")
    ignored_edges: int = Field(description="other method or window length, or too far from now (since start)")
    last_solve: SolveStats | None = Field(description="None where another cluster member solves (hosts then come "
                                                      "from the store)")
    hosts: list[HostClock]


@router.get("/clock", response_model=ClockStatus, summary="Newest clock solution per host, last solve counts")
def clock(clk: ClockDep, config: ConfigDep,
          host: list[str] = Param([], description="only these hosts (repeatable)")) -> ClockStatus:
    cfg = config.clock
    now = time.time_ns()
    solutions, last, pending = clk.snapshot()
    if not clk.solves_here:  # a cluster member without `correlate`: the solving member's, from the store
        solutions = clk.stored()
    wanted = set(host)
    hosts = [HostClock(host=s.host, window_start=s.window_start, offset_ns=s.offset_ns, drift_ppb=s.drift_ppb,
                       bound_ns=s.bound_ns, component=s.component, age_s=(now - s.window_start) / 1e9,
                       in_last_solve=last is not None and s.window_start == last.slot_start_ns)
             for s in solutions if not wanted or s.host in wanted]
    return ClockStatus(enabled=cfg.enabled, method=cfg.method, window_s=cfg.window_s, solve_lag_s=cfg.solve_lag,
                       max_age_s=cfg.max_age, pending_edges=pending, late_edges=clk.late, ignored_edges=clk.ignored,
                       last_solve=last, hosts=hosts)
