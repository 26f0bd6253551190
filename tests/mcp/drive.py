"""Drives fleetroll's MCP server with the official Python ``mcp`` SDK (plus the small client-side Tasks
extension in ``tasks_client.py``), one step per invocation, for the Rust integration tests in
``tests/it/mcp.rs``. Each command prints exactly one JSON object on stdout; a JSON-RPC error is printed as
``{"error": {"code": ..., "message": ...}}`` (exit status 0), anything else unexpected exits non-zero.

    drive.py start URL ARGS_JSON [--token T]            rollout_fleet with the Tasks extension -> CreateTaskResult
    drive.py wait URL TASK_ID [--until STATUS] [--token T] [--timeout S]   poll tasks/get -> GetTaskResult
    drive.py get URL TASK_ID [--token T]                 one tasks/get
    drive.py approve URL TASK_ID [--token T]             wait for input_required, accept every request -> ack
    drive.py cancel URL TASK_ID [--token T]              tasks/cancel twice -> both acks
    drive.py call URL TOOL ARGS_JSON [--mode M] [--no-tasks] [--token T]   one tools/call -> raw result
    drive.py tools URL [--token T]                       tools/list -> {"tools": [names]}
    drive.py raw URL METHOD PARAMS_JSON [--token T] [--header K=V] [--body TEXT | --pad BYTES]   one HTTP POST, no SDK
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import anyio
from mcp.shared.exceptions import MCPError

import tasks_client as tc


def _error(e: MCPError) -> dict:
    return {"error": {"code": e.code, "message": e.message, "data": getattr(e, "data", None)}}


def _first_mcp_error(group: BaseExceptionGroup) -> MCPError | None:
    for e in group.exceptions:
        if isinstance(e, MCPError):
            return e
        if isinstance(e, BaseExceptionGroup) and (found := _first_mcp_error(e)):
            return found
    return None


async def _with_client(args, fn, *, tasks=True, elicitation=True, mode=tc.MODERN):
    # Errors raised while connecting arrive wrapped in the transport's exception groups.
    try:
        async with tc.connect(args.url, tasks=tasks, elicitation=elicitation, token=args.token, mode=mode) as c:
            try:
                return await fn(c)
            except MCPError as e:
                return _error(e)
    except BaseExceptionGroup as group:
        found = _first_mcp_error(group)
        if found is None:
            raise
        return _error(found)


async def run(args) -> dict:
    cmd = args.command
    if cmd == "start":
        return await _with_client(args, lambda c: tc.call_tool_raw(c, "rollout_fleet", json.loads(args.args)))
    if cmd == "wait":
        until = {args.until} if args.until else tc.TERMINAL_STATUSES

        async def wait(c):
            # With --message: until the status message says it too (a task is working for many reasons).
            deadline = time.monotonic() + args.timeout
            while True:
                task = await tc.wait_for_task(c, args.task_id, until=until, timeout=args.timeout)
                said = args.message is None or args.message in (task.get("statusMessage") or "")
                if said or task.get("status") in tc.TERMINAL_STATUSES or time.monotonic() > deadline:
                    return task
                await anyio.sleep(0.5)

        return await _with_client(args, wait)
    if cmd == "get":
        return await _with_client(args, lambda c: tc.get_task(c, args.task_id))
    if cmd == "approve":

        async def approve(c):
            task = await tc.wait_for_task(c, args.task_id, until={"input_required"}, timeout=args.timeout)
            if task["status"] != "input_required":
                return {"error": {"code": 0, "message": f"task is {task['status']}, not input_required"}, "task": task}
            answers = {key: tc.accept({"approve": True}) for key in task["inputRequests"]}
            ack = await tc.update_task(c, args.task_id, answers)
            return {"ack": ack, "answered": sorted(answers), "asked": task["inputRequests"]}

        return await _with_client(args, approve)
    if cmd == "cancel":

        async def cancel(c):
            first = await tc.cancel_task(c, args.task_id)
            second = await tc.cancel_task(c, args.task_id)
            return {"acks": [first, second]}

        return await _with_client(args, cancel)
    if cmd == "call":
        return await _with_client(
            args,
            lambda c: tc.call_tool_raw(c, args.tool, json.loads(args.args)),
            tasks=not args.no_tasks,
            elicitation=False,
            mode=args.mode,
        )
    if cmd == "legacy-call":
        # A 2025-11-25 client: initialize, then tools/call through the SDK's own API.
        async def legacy(c):
            result = await c.call_tool(args.tool, json.loads(args.args))
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)

        return await _with_client(args, legacy, tasks=False, elicitation=False, mode="legacy")
    if cmd == "tools":

        async def tools(c):
            return {"tools": [t["name"] for t in await tc.list_tools(c)]}

        return await _with_client(args, tools, tasks=False, elicitation=False)
    if cmd == "raw":
        headers = dict(h.split("=", 1) for h in args.header)
        if args.pad:
            # A well-formed request, padded to `pad` bytes (too big for a command line).
            args.body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": args.method, "params": {"pad": "x" * args.pad}})
        if args.body is not None:
            import httpx

            h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
            if args.token:
                h["Authorization"] = f"Bearer {args.token}"
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(args.url, content=args.body.encode(), headers=h)
            try:
                body = r.json()
            except ValueError:
                body = r.text
            return {"status": r.status_code, "headers": {k.lower(): v for k, v in r.headers.items()}, "body": body}
        status, hdrs, body = await tc.http_post(
            args.url, args.method, json.loads(args.params), token=args.token,
            headers={k: (None if v == "" else v) for k, v in headers.items()},
        )
        return {"status": status, "headers": hdrs, "body": body}
    raise SystemExit(f"unknown command {cmd}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("url")
    p.add_argument("rest", nargs="*")
    p.add_argument("--token")
    p.add_argument("--until")
    p.add_argument("--message")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--mode", default=tc.MODERN)
    p.add_argument("--no-tasks", action="store_true")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--body")
    p.add_argument("--pad", type=int, default=0)
    args = p.parse_args()
    rest = args.rest
    if args.command in ("start",):
        args.args = rest[0]
    elif args.command in ("wait", "get", "approve", "cancel"):
        args.task_id = rest[0]
    elif args.command in ("call", "legacy-call"):
        args.tool, args.args = rest[0], rest[1]
    elif args.command == "raw":
        args.method, args.params = rest[0], rest[1] if len(rest) > 1 else "{}"
    print(json.dumps(anyio.run(run, args)))


if __name__ == "__main__":
    sys.exit(main())
