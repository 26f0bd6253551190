"""Client side of the MCP Tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) on top of
the Python ``mcp`` 2.3.0 SDK's extension hooks.

The SDK has no built-in 2026-07-28 Tasks support (its ``mcp_types.GetTaskRequest`` & co. are the
2025-11-25 shapes: nested ``task``, ``ttl``/``pollInterval``). It does offer the hooks used here:

* ``mcp.client.extension.ClientExtension`` / ``ResultClaim`` (mcp/client/extension.py): declare
  ``capabilities.extensions[<id>]`` and claim ``resultType:"task"`` on ``tools/call``;
* ``mcp_types.Request.name_param`` (mcp_types/_types.py): ``ClientSession.send_request`` mirrors
  ``params[name_param]`` into the ``Mcp-Name`` header (SEP-2663 requires ``Mcp-Name: <taskId>``);
* ``ClientSession.send_request(request, TypeAdapter(dict))`` (mcp/client/session.py) returns the raw
  result dict, so wire-level assertions see exactly what the server sent.

Two ways to use it::

    # 1. transparent: client.call_tool() polls tasks/get and returns the final CallToolResult
    async with connect(url, tasks=True) as c:
        res = await c.call_tool("slow_compute", {"seconds": 1})

    # 2. step-wise, raw dicts (for tests)
    async with connect(url, tasks=True, elicitation=True) as c:
        created = await call_tool_as_task(c, "confirm_delete", {"filename": "x"})
        t = await wait_for_task(c, created["taskId"], until={"input_required"})
        await update_task(c, created["taskId"], {k: accept({"confirm": True}) for k in t["inputRequests"]})
        done = await wait_for_task(c, created["taskId"])
        await cancel_task(c, some_other_task_id)

``connect(url, mode="legacy")`` gives a plain 2025-11-25 (initialize-based) client;
``connect(url, tasks=False)`` a 2026-07-28 client that does not declare the extension.
Capabilities are per ``Client`` (the SDK stamps them on every request and overwrites any
``_meta`` clientCapabilities you pass), so use one client per capability set.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ErrorData, Request, RequestParams, Result
from pydantic import ConfigDict, TypeAdapter

__all__ = [
    "TASKS_EXTENSION_ID",
    "TERMINAL_STATUSES",
    "CreateTaskResultV2",
    "TasksExtension",
    "TaskCancelled",
    "TaskFailed",
    "TaskInputRequired",
    "connect",
    "call_tool_raw",
    "call_tool_as_task",
    "get_task",
    "update_task",
    "cancel_task",
    "wait_for_task",
    "raw_request",
    "http_post",
    "list_tools",
    "accept",
    "decline",
]

TASKS_EXTENSION_ID = "io.modelcontextprotocol/tasks"
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
MODERN = "2026-07-28"

_RAW: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


# --------------------------------------------------------------------------- wire models


class CreateTaskResultV2(Result):
    """``tools/call`` result with ``resultType:"task"`` (flat ``Result & Task``, SEP-2663).

    Field names follow the SDK's camelCase alias generator: ``task_id`` <-> ``taskId``,
    ``ttl_ms`` <-> ``ttlMs``, ``poll_interval_ms`` <-> ``pollIntervalMs``. Unknown keys are kept.
    """

    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class TasksGetRequest(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # -> Mcp-Name: <taskId>


class TasksUpdateRequest(Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class TasksCancelRequest(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class _AnyRequest(Request[dict[str, Any] | None, str]):
    """Arbitrary method; used by ``raw_request``. ``name_param`` is set per call via a subclass."""

    params: dict[str, Any] | None = None


# --------------------------------------------------------------------------- errors


class TaskFailed(MCPError):
    """The task ended ``failed``; ``.error`` is the inlined JSON-RPC error, ``.task`` the GetTaskResult."""

    def __init__(self, task: dict[str, Any]):
        err = task.get("error") or {}
        super().__init__(err.get("code", types.INTERNAL_ERROR), err.get("message", "task failed"), err.get("data"))
        self.task = task


class TaskCancelled(RuntimeError):
    def __init__(self, task: dict[str, Any]):
        super().__init__(f"task {task.get('taskId')} was cancelled")
        self.task = task


class TaskInputRequired(RuntimeError):
    """Raised by the transparent resolver when a task needs input and no ``on_input_required`` is set."""

    def __init__(self, task: dict[str, Any]):
        super().__init__(f"task {task.get('taskId')} is input_required: {sorted(task.get('inputRequests') or {})}")
        self.task = task


# --------------------------------------------------------------------------- low-level helpers


async def raw_request(
    client: Client,
    method: str,
    params: Mapping[str, Any] | None = None,
    *,
    name_param: str | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Send any JSON-RPC request through the session (headers + ``_meta`` stamped by the SDK).

    Returns the raw ``result`` dict; a JSON-RPC error raises ``mcp.shared.exceptions.MCPError``
    (``.code``, ``.error.data``). ``name_param`` names the params key mirrored into ``Mcp-Name``
    (tools/call, prompts/get, resources/read get it automatically).
    """
    cls = _AnyRequest
    if name_param is not None:
        cls = type("_NamedRequest", (_AnyRequest,), {"name_param": name_param})
    req = cls(method=method, params=dict(params) if params is not None else {})
    return await client.session.send_request(req, _RAW, request_read_timeout_seconds=timeout)


async def list_tools(client: Client) -> list[dict[str, Any]]:
    """Raw ``tools/list`` (all pages), bypassing the SDK's response cache."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        res = await raw_request(client, "tools/list", {"cursor": cursor} if cursor else {})
        tools += res.get("tools", [])
        cursor = res.get("nextCursor")
        if not cursor:
            return tools


async def call_tool_raw(
    client: Client,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    input_responses: Mapping[str, Any] | None = None,
    request_state: str | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One ``tools/call`` round; returns the raw result whatever its ``resultType``
    (``complete``, ``input_required`` or ``task``). No MRTR driving, no polling."""
    params: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
    if input_responses is not None:
        params["inputResponses"] = dict(input_responses)
    if request_state is not None:
        params["requestState"] = request_state
    return await raw_request(client, "tools/call", params, timeout=timeout)


async def call_tool_as_task(
    client: Client, name: str, arguments: Mapping[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    """``tools/call`` that must come back as a CreateTaskResult; returns it as a raw dict."""
    res = await call_tool_raw(client, name, arguments, **kw)
    if res.get("resultType") != "task":
        raise AssertionError(f"{name}: expected resultType 'task', got {res.get('resultType')!r}: {res}")
    return res


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    """``tasks/get`` -> raw GetTaskResult (``resultType``, ``taskId``, ``status``, ``statusMessage``,
    ``createdAt``, ``lastUpdatedAt``, ``ttlMs``, ``pollIntervalMs``, and per status ``inputRequests``
    / ``result`` / ``error``)."""
    return await client.session.send_request(TasksGetRequest(params=TaskIdParams(task_id=task_id)), _RAW)


async def update_task(client: Client, task_id: str, input_responses: Mapping[str, Any]) -> dict[str, Any]:
    """``tasks/update`` with ``inputResponses`` (key -> ElicitResult/CreateMessageResult/ListRootsResult
    as plain dicts, e.g. ``accept({...})``). Returns the ack (``{"resultType":"complete"}``)."""
    req = TasksUpdateRequest(params=UpdateTaskParams(task_id=task_id, input_responses=dict(input_responses)))
    return await client.session.send_request(req, _RAW)


async def cancel_task(client: Client, task_id: str) -> dict[str, Any]:
    """``tasks/cancel`` -> ack ``{"resultType":"complete"}``; the terminal status shows on tasks/get."""
    return await client.session.send_request(TasksCancelRequest(params=TaskIdParams(task_id=task_id)), _RAW)


async def wait_for_task(
    client: Client,
    task_id: str,
    *,
    until: frozenset[str] | set[str] = TERMINAL_STATUSES,
    timeout: float = 30.0,
    interval: float | None = None,
) -> dict[str, Any]:
    """Poll ``tasks/get`` until ``status`` is in ``until`` (or terminal); returns that GetTaskResult.

    ``interval`` defaults to the server's ``pollIntervalMs`` (capped at 1 s)."""
    deadline = time.monotonic() + timeout
    while True:
        task = await get_task(client, task_id)
        status = task.get("status")
        if status in until or status in TERMINAL_STATUSES:
            return task
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {task_id} still {status!r} after {timeout}s")
        step = interval if interval is not None else min((task.get("pollIntervalMs") or 500) / 1000, 1.0)
        await anyio.sleep(step)


def accept(content: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An ElicitResult ``{"action":"accept","content":{...}}``."""
    return {"action": "accept", "content": dict(content or {})}


def decline() -> dict[str, Any]:
    return {"action": "decline"}


# --------------------------------------------------------------------------- raw HTTP (no SDK)

_NAME_KEYS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
              "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
_rpc_id = 0


async def http_post(
    url: str,
    method: str,
    params: Mapping[str, Any] | None = None,
    *,
    token: str | None = None,
    tasks: bool = True,
    capabilities: Mapping[str, Any] | None = None,
    version: str = MODERN,
    meta: Mapping[str, Any] | None = None,
    headers: Mapping[str, str | None] | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], Any]:
    """One raw 2026-07-28 JSON-RPC POST with plain ``httpx`` (no SDK): for HTTP-level assertions
    the SDK hides (401 + ``WWW-Authenticate``, 400/404 statuses, header mismatches).

    Adds ``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` and the ``_meta`` keys (clientCapabilities
    = ``capabilities`` or ``{extensions:{tasks:{}}}`` when ``tasks``). ``headers`` override (``None``
    value = drop the header); ``meta`` is merged over the generated ``_meta``. Returns
    ``(status, lowercase headers, parsed JSON body | last JSON-RPC message of an SSE body | text)``.
    """
    import json

    import httpx

    global _rpc_id
    _rpc_id += 1
    caps = dict(capabilities) if capabilities is not None else ({"extensions": {TASKS_EXTENSION_ID: {}}} if tasks else {})
    p = dict(params or {})
    p["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "fleetroll-tests", "version": "0.0.0"},
        **dict(meta or {}),
    }
    h: dict[str, str | None] = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": version,
        "Mcp-Method": method,
    }
    if (k := _NAME_KEYS.get(method)) and isinstance(p.get(k), str):
        h["Mcp-Name"] = p[k]
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    lower = {key.lower(): key for key in h}
    for key, value in (headers or {}).items():
        h.pop(lower.get(key.lower(), key), None)
        if value is not None:
            h[key] = value
    body = {"jsonrpc": "2.0", "id": _rpc_id, "method": method, "params": p}
    async with httpx.AsyncClient(timeout=timeout) as http:
        r = await http.post(url, json=body, headers={k: v for k, v in h.items() if v is not None})
    text = r.text
    parsed: Any = text
    if "text/event-stream" in r.headers.get("content-type", ""):
        msgs = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        parsed = next((m for m in msgs if m.get("id") == _rpc_id), msgs[-1] if msgs else text)
    else:
        try:
            parsed = json.loads(text)
        except ValueError:
            pass
    return r.status_code, {k.lower(): v for k, v in r.headers.items()}, parsed


# --------------------------------------------------------------------------- the extension

InputHandler = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]]
"""Receives the ``input_required`` GetTaskResult, returns ``inputResponses`` for ``tasks/update``."""


class TasksExtension(ClientExtension):
    """Declares ``io.modelcontextprotocol/tasks`` and claims ``resultType:"task"`` on ``tools/call``.

    With it, ``Client.call_tool`` resolves a CreateTaskResult transparently: it polls ``tasks/get``
    until terminal and returns the inlined ``CallToolResult``; ``failed`` raises ``TaskFailed``,
    ``cancelled`` raises ``TaskCancelled``. ``input_required`` is answered with ``on_input_required``
    (keys already answered are not re-sent) or raises ``TaskInputRequired``.
    For step-wise control use ``client.session.call_tool(..., allow_claimed=True)`` (returns a
    ``CreateTaskResultV2``) or the raw helpers above.
    """

    identifier = TASKS_EXTENSION_ID

    def __init__(self, *, on_input_required: InputHandler | None = None, timeout: float = 60.0):
        self.on_input_required = on_input_required
        self.timeout = timeout
        self.last_task: dict[str, Any] | None = None  # final GetTaskResult of the last resolved task

    def claims(self) -> tuple[ResultClaim[CreateTaskResultV2], ...]:
        return (ResultClaim(result_type="task", model=CreateTaskResultV2, resolve=self._resolve),)

    async def _resolve(self, created: CreateTaskResultV2, ctx: ClaimContext) -> CallToolResult:
        answered: set[str] = set()
        deadline = time.monotonic() + self.timeout
        while True:
            task = await ctx.session.send_request(TasksGetRequest(params=TaskIdParams(task_id=created.task_id)), _RAW)
            status = task.get("status")
            if status == "completed":
                self.last_task = task
                return CallToolResult.model_validate(task.get("result") or {}, by_name=False)
            if status == "failed":
                self.last_task = task
                raise TaskFailed(task)
            if status == "cancelled":
                self.last_task = task
                raise TaskCancelled(task)
            if status == "input_required":
                pending = {k: v for k, v in (task.get("inputRequests") or {}).items() if k not in answered}
                if pending:
                    if self.on_input_required is None:
                        raise TaskInputRequired(task)
                    responses = dict(await self.on_input_required({**task, "inputRequests": pending}))
                    answered.update(responses)
                    await ctx.session.send_request(
                        TasksUpdateRequest(params=UpdateTaskParams(task_id=created.task_id, input_responses=responses)),
                        _RAW,
                    )
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {created.task_id} still {status!r} after {self.timeout}s")
            await anyio.sleep(min((task.get("pollIntervalMs") or 500) / 1000, 1.0))


# --------------------------------------------------------------------------- connecting

ElicitCallback = Callable[[ClientRequestContext, types.ElicitRequestParams], Awaitable[types.ElicitResult | ErrorData]]


async def _decline_all(_ctx: ClientRequestContext, _params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="decline")


@asynccontextmanager
async def connect(
    url: str,
    *,
    mode: str = MODERN,
    tasks: bool | TasksExtension = True,
    elicitation: bool | ElicitCallback = False,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    read_timeout_seconds: float | None = 30.0,
    client_info: tuple[str, str] = ("fleetroll-tests", "0.0.0"),
    extensions: list[ClientExtension] | None = None,
    **client_kwargs: Any,
) -> AsyncIterator[Client]:
    """Open an ``mcp.Client`` over Streamable HTTP.

    mode:        ``"2026-07-28"`` (pin; no discover probe, a synthetic DiscoverResult is adopted),
                 ``"auto"`` (probe ``server/discover``, fall back to ``initialize``) or ``"legacy"``
                 (2025-11-25 ``initialize`` handshake; extensions/claims inactive).
    tasks:       declare the Tasks extension (``True``, or a configured ``TasksExtension``); ``False``
                 = a 2026-07-28 client without it.
    elicitation: declare the elicitation capability (``form`` + ``url``). The SDK declares it iff an
                 elicitation callback is installed: ``True`` installs one that declines; pass your own
                 callback to answer MRTR ``input_required`` rounds driven by ``Client.call_tool``.
    token:       sent as ``Authorization: Bearer <token>`` on every HTTP request.
    """
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    exts: list[ClientExtension] = list(extensions or [])
    if tasks:
        exts.append(tasks if isinstance(tasks, TasksExtension) else TasksExtension())
    kwargs = dict(client_kwargs)
    if elicitation:
        kwargs["elicitation_callback"] = _decline_all if elicitation is True else elicitation
    async with create_mcp_http_client(headers=hdrs) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(
            transport,
            mode=mode,
            extensions=exts or None,
            read_timeout_seconds=read_timeout_seconds,
            client_info=types.Implementation(name=client_info[0], version=client_info[1]),
            **kwargs,
        ) as client:
            yield client
