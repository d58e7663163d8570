"""The gNMI collector's replay transport: a gNMI stub whose target is a recording.

responses.json holds what the target answered, as the proto JSON of gnmi.proto's messages
(google.protobuf.json_format, the form `gnmic --format protojson` prints):

    {"Capabilities": {CapabilityResponse},
     "Get":       [{"request": {GetRequest}, "response": {GetResponse}} | {"request": ..., "error": ERROR}],
     "Subscribe": [{"request": {SubscribeRequest}, "responses": [{SubscribeResponse}, ...], "error": ERROR?}]}

ERROR is {"code": "NOT_FOUND", "details": "..."} (the gRPC status the target ended the call with).
The replay stub answers at the collector's transport seam (`_Session.stub`): a request equal to a
recorded one gets its recorded answer, so the collector's own Capabilities check, inventory,
Subscribe handling (refused queues and the subscription made again), and parsing run on what the
target sent. A request not recorded fails the test, naming it. `mode: once` and the default poll
only (a STREAM's timing is not replayed). No gRPC connection is made.

`RecordingStub` wraps a real stub and writes this file (tests/collector_cases/record.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from pygnmi.spec.v080 import gnmi_pb2

from collectors.base import PollResult
from collectors.gnmi.collector import GnmiCollector
from nms.config.models import SwitchConfig


def _dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _error(recorded: dict) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(getattr(grpc.StatusCode, recorded["code"]), grpc.aio.Metadata(),
                                grpc.aio.Metadata(), details=recorded.get("details", ""))


class _Call:
    """A Subscribe call's side the collector reads: the recorded responses, then the recorded error."""

    def __init__(self, responses: list, error: dict | None):
        self.responses, self.error = responses, error

    async def __aiter__(self):
        for r in self.responses:
            yield json_format.ParseDict(r, gnmi_pb2.SubscribeResponse())
        if self.error is not None:
            raise _error(self.error)

    def cancel(self) -> bool:
        return True


class ReplayStub:
    def __init__(self, recording: dict, where: str):
        self.recording, self.where = recording, where

    def _find(self, rpc: str, request) -> dict:
        for entry in self.recording.get(rpc, []):
            if json_format.ParseDict(entry["request"], type(request)()) == request:
                return entry
        raise AssertionError(f"{self.where}: {rpc} request not in this recording: {_dict(request)}")

    async def Capabilities(self, request, **_kwargs):
        return json_format.ParseDict(self.recording["Capabilities"], gnmi_pb2.CapabilityResponse())

    async def Get(self, request, **_kwargs):
        entry = self._find("Get", request)
        if "error" in entry:
            raise _error(entry["error"])
        return json_format.ParseDict(entry["response"], gnmi_pb2.GetResponse())

    def Subscribe(self, requests, **_kwargs):
        entry = self._find("Subscribe", next(iter(requests)))
        return _Call(entry.get("responses", []), entry.get("error"))


class RecordingStub:
    """A real stub's answers, recorded in `recording` (the shape above) as the collector asks."""

    def __init__(self, stub):
        self.stub, self.recording = stub, {"Capabilities": None, "Get": [], "Subscribe": []}

    async def Capabilities(self, request, **kwargs):
        answer = await self.stub.Capabilities(request, **kwargs)
        self.recording["Capabilities"] = _dict(answer)
        return answer

    async def Get(self, request, **kwargs):
        entry: dict[str, Any] = {"request": _dict(request)}
        self.recording["Get"].append(entry)
        try:
            answer = await self.stub.Get(request, **kwargs)
        except grpc.aio.AioRpcError as e:
            entry["error"] = {"code": e.code().name, "details": e.details() or ""}
            raise
        entry["response"] = _dict(answer)
        return answer

    def Subscribe(self, requests, **kwargs):
        requests = list(requests)  # ONCE: the one SubscribeRequest
        entry: dict[str, Any] = {"request": _dict(requests[0]), "responses": []}
        self.recording["Subscribe"].append(entry)
        return _RecordingCall(self.stub.Subscribe(iter(requests), **kwargs), entry)


class _RecordingCall:
    def __init__(self, call, entry: dict):
        self.call, self.entry = call, entry

    async def __aiter__(self):
        try:
            async for response in self.call:
                self.entry["responses"].append(_dict(response))
                yield response
        except grpc.aio.AioRpcError as e:
            self.entry["error"] = {"code": e.code().name, "details": e.details() or ""}
            raise

    def cancel(self) -> bool:
        return self.call.cancel()


async def replay_gnmi(device: SwitchConfig, responses: Path) -> PollResult:
    collector = GnmiCollector()
    session = await collector._session(device)
    session.stub = ReplayStub(json.loads(responses.read_text()), str(responses))
    try:
        return await collector.collect(device)
    finally:
        await collector.close()
