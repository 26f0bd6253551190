// The dashboard's HTTP API: the bearer token, JSON calls, and Server-Sent Events read over fetch()
// (EventSource cannot send the Authorization header), re-opened with backoff when the stream breaks.

const TOKEN_KEY = "fleetroll-token";
let token = "";

/** An answer other than 2xx; `message` is the API server's or the policy's words, shown unchanged. */
export class ApiError extends Error {
  constructor(readonly status: number, readonly reason: string, message: string) {
    super(message);
  }
}

/**
 * Takes the token from `#token=…` (kept in sessionStorage so a reload works) and replaces the address
 * with `/` + the route, so the token is not left in the address bar or history. False: no token at all.
 */
export function initToken(): boolean {
  const m = /(?:^#|[&?])token=([A-Za-z0-9._~-]+)/.exec(location.hash);
  if (m?.[1]) {
    token = m[1];
    try { sessionStorage.setItem(TOKEN_KEY, token); } catch { /* storage off: this page load still works */ }
    const route = location.hash.replace(/[#&?]token=[A-Za-z0-9._~-]+/, "");
    history.replaceState(null, "", "/" + (route.startsWith("#/") ? route : "#/"));
  } else {
    try { token = sessionStorage.getItem(TOKEN_KEY) ?? ""; } catch { token = ""; }
  }
  return token !== "";
}

function headers(extra?: Record<string, string>): Record<string, string> {
  return { Authorization: `Bearer ${token}`, ...extra };
}

async function errorOf(res: Response): Promise<ApiError> {
  try {
    const body: unknown = await res.json();
    const e = (body as { error?: { reason?: unknown; message?: unknown } } | null)?.error;
    if (e && e.message !== undefined) return new ApiError(res.status, String(e.reason ?? ""), String(e.message));
  } catch { /* not JSON: fall back to the status line */ }
  return new ApiError(res.status, "", `${res.status} ${res.statusText}`.trim());
}

async function call<T>(path: string, init: RequestInit): Promise<T> {
  let res: Response;
  try {
    res = await fetch(path, { cache: "no-store", ...init });
  } catch (e) {
    throw new ApiError(0, "Unreachable", `The dashboard did not answer (${e instanceof Error ? e.message : String(e)}).`);
  }
  if (!res.ok) throw await errorOf(res);
  return (await res.json()) as T;
}

export function getJSON<T>(path: string): Promise<T> {
  return call<T>(path, { headers: headers({ Accept: "application/json" }) });
}

/** POST; the browser adds the Origin header the server checks. */
export function post<T>(path: string, body: string, contentType = "application/json"): Promise<T> {
  return call<T>(path, { method: "POST", body, headers: headers({ "Content-Type": contentType, Accept: "application/json" }) });
}

export interface StreamHandlers {
  /** One SSE event with its JSON data. */
  event(name: string, data: unknown): void;
  /** The page's own stream to the dashboard broke; `retryMs` until it is re-opened. */
  lost(message: string, retryMs: number): void;
  /** An answer that retrying cannot fix (a wrong token, a rollout that does not exist). */
  fatal(error: ApiError): void;
}

const MAX_BACKOFF_MS = 10_000;
// Keep-alives come every 15 s: this much silence means a dead connection the network never reported.
const SILENCE_MS = 40_000;

/** Opens an SSE stream and keeps it open (1 s, 2 s, 4 s… up to 10 s apart) until the returned close(). */
export function openStream(path: string, on: StreamHandlers): () => void {
  let closed = false;
  let ctl = new AbortController();
  let retry: number | undefined;
  let attempt = 0;

  const run = async (): Promise<void> => {
    ctl = new AbortController();
    let why = "the stream ended";
    try {
      const res = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal: ctl.signal, cache: "no-store" });
      if (!res.ok) {
        const err = await errorOf(res);
        if (res.status === 401 || res.status === 403 || res.status === 404) { on.fatal(err); return; }
        why = err.message;
      } else if (res.body) {
        await readEvents(res.body, ctl, (name, data) => { attempt = 0; on.event(name, data); });
      }
    } catch (e) {
      if (closed) return;
      why = e instanceof Error ? e.message : String(e);
    }
    if (closed) return;
    const wait = Math.min(1000 * 2 ** attempt, MAX_BACKOFF_MS);
    attempt++;
    on.lost(why, wait);
    retry = window.setTimeout(() => void run(), wait);
  };
  void run();
  return () => {
    closed = true;
    window.clearTimeout(retry);
    ctl.abort();
  };
}

/** Parses the SSE format (event:/data: lines, a blank line ends an event, `:` lines are keep-alives). */
async function readEvents(
  body: ReadableStream<Uint8Array>, ctl: AbortController, dispatch: (name: string, data: unknown) => void,
): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let silence = window.setTimeout(() => ctl.abort(), SILENCE_MS);
  let buf = "";
  let scanned = 0; // buf[0..scanned) holds no newline: a long line is not searched again chunk after chunk
  let cr = false; // the last chunk ended in \r: a \n starting the next one belongs to it
  let name = "";
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      window.clearTimeout(silence);
      silence = window.setTimeout(() => ctl.abort(), SILENCE_MS);
      let chunk = decoder.decode(value, { stream: true });
      if (cr && chunk.startsWith("\n")) chunk = chunk.slice(1);
      cr = chunk.endsWith("\r");
      buf += chunk.replace(/\r\n?/g, "\n");
      let start = 0;
      for (let nl = buf.indexOf("\n", scanned); nl !== -1; nl = buf.indexOf("\n", start)) {
        const line = buf.slice(start, nl);
        start = nl + 1;
        if (line === "") {
          if (data.length > 0) {
            const text = data.join("\n");
            let parsed: unknown;
            try { parsed = JSON.parse(text); } catch { parsed = undefined; console.warn("fleetroll: event data is not JSON", name); }
            if (parsed !== undefined) {
              try { dispatch(name || "message", parsed); } catch (e) { console.error("fleetroll: handling", name, e); }
            }
          }
          name = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon === -1 ? line : line.slice(0, colon);
        let val = colon === -1 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "event") name = val;
        else if (field === "data") data.push(val);
      }
      buf = buf.slice(start);
      scanned = buf.length;
    }
  } finally {
    window.clearTimeout(silence);
    reader.cancel().catch(() => undefined);
  }
}
