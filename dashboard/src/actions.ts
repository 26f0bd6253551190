// Actions as the user: a confirmation <dialog> (focus kept inside, Escape cancels), the POST, and
// the answer shown verbatim in #action-result.

import { ApiError, post } from "./api.js";
import { byId, setText } from "./dom.js";
import { showResult } from "./page.js";
import type { Action } from "./types.js";

export const ACTION_LABELS: Record<Action, string> = {
  approve: "Approve", pause: "Pause", resume: "Resume", abort: "Abort", rollback: "Roll back",
};

export interface ApproveBody { batch: number; planHash: string; gatesHash: string }

export interface Request {
  action: Action;
  namespace: string;
  name: string;
  /** approve: the pending approval the page showed, so a plan changed meanwhile is refused. */
  approval?: ApproveBody | undefined;
}

let user = "";
/** Who acts, as /api/me said: named in the confirmation. */
export function setUser(u: string): void { user = u; }

function question(r: Request): string {
  const it = `${r.namespace}/${r.name}`;
  switch (r.action) {
    case "approve":
      return `Approve ${r.approval ? `batch ${r.approval.batch + 1} of ` : ""}${it}? Its targets change once the operator sees the approval.`;
    case "pause": return `Pause ${it}? The batch in flight finishes; no other batch starts until it is resumed.`;
    case "resume": return `Resume ${it}? Its next batch may start.`;
    case "abort": return `Abort ${it} for good? Targets already changed keep the new image.`;
    case "rollback": return `Roll back ${it}? The previous image of every target it changed is restored, then it stops.`;
  }
}

let settle: ((ok: boolean) => void) | null = null;

function dialog(): HTMLDialogElement {
  const d = byId<HTMLDialogElement>("confirm");
  if (d.dataset["wired"]) return d;
  d.dataset["wired"] = "1";
  const done = (ok: boolean): void => {
    if (d.open) d.close();
    const s = settle;
    settle = null;
    s?.(ok);
  };
  byId("confirm-ok").addEventListener("click", () => done(true));
  byId("confirm-cancel").addEventListener("click", () => done(false));
  // Escape: the browser fires `cancel`; closing by any other way than OK is a no.
  d.addEventListener("cancel", (e) => { e.preventDefault(); done(false); });
  d.addEventListener("close", () => done(false));
  d.addEventListener("keydown", (e) => {
    if (e.key !== "Tab") return;
    const f = [...d.querySelectorAll<HTMLElement>("button:not([disabled])")];
    const first = f[0];
    const last = f[f.length - 1];
    if (!first || !last) return;
    if (e.shiftKey && document.activeElement === first) { e.preventDefault(); last.focus(); }
    else if (!e.shiftKey && document.activeElement === last) { e.preventDefault(); first.focus(); }
  });
  return d;
}

/** Asks; true when the user confirmed. */
export function confirmAction(r: Request): Promise<boolean> {
  const d = dialog();
  settle?.(false);
  setText(byId("confirm-title"), `${ACTION_LABELS[r.action]} ${r.namespace}/${r.name}`);
  setText(byId("confirm-text"), question(r));
  setText(byId("confirm-as"), user ? `You act as ${user}.` : "");
  const ok = byId("confirm-ok");
  setText(ok, ACTION_LABELS[r.action]);
  ok.dataset["action"] = r.action;
  return new Promise((resolve) => {
    settle = resolve;
    d.showModal();
    // The safe choice has the focus: Enter alone does not abort a rollout.
    byId("confirm-cancel").focus();
  });
}

/** Confirms, then POSTs; the answer (or the refusal, verbatim) goes to #action-result. */
export async function runAction(r: Request): Promise<boolean> {
  if (!(await confirmAction(r))) return false;
  showResult("pending", `${ACTION_LABELS[r.action]}: sending…`);
  const path = `/api/rollouts/${encodeURIComponent(r.namespace)}/${encodeURIComponent(r.name)}/${r.action}`;
  const body = r.action === "approve" && r.approval ? r.approval : {};
  try {
    const res = await post<{ message?: string }>(path, JSON.stringify(body));
    showResult("ok", String(res?.message ?? "done"));
    return true;
  } catch (e) {
    showResult("refused", e instanceof ApiError ? e.message : String(e));
    return false;
  }
}
