// What every view shares: the connection indicator, the action result, phase badges, and the test hook.

import { byId, h, setAttrs, setText } from "./dom.js";
import type { Summary } from "./types.js";

declare global {
  interface Window {
    fleetrollDashboard: { renderedAt: number; receivedAt: number; cells: () => number };
  }
}

let cellCount = 0;
let renders = 0; // bumped per view and per render: only the latest stamps
window.fleetrollDashboard = { renderedAt: 0, receivedAt: 0, cells: () => cellCount };

let receiving = 0;

/** The data of a full render has just arrived (before it is rendered). */
export function received(): void {
  receiving = Date.now();
}

/** A new view starts: it has not rendered yet. */
export function viewStarted(): void {
  renders++;
  window.fleetrollDashboard.renderedAt = 0;
  cellCount = 0;
}

/**
 * The view's full render is in the DOM: stamp once the frame showing it was painted (a task queued from
 * the frame's animation callback runs after its paint), or at once when the page is hidden (no frames).
 */
export function rendered(cells = cellCount): void {
  cellCount = cells;
  // When the data this render shows had arrived: render time is renderedAt - receivedAt.
  window.fleetrollDashboard.receivedAt = receiving;
  const view = ++renders;
  const stamp = (): void => { if (view === renders) window.fleetrollDashboard.renderedAt = Date.now(); };
  if (document.hidden) stamp();
  else requestAnimationFrame(() => setTimeout(stamp, 0));
}

export function setCellCount(n: number): void {
  cellCount = n;
}

/** The indicator: the cluster watch (the server's `connection` events) and the page's own stream. */
export function setConnection(state: "live" | "reconnecting", message = ""): void {
  const el = byId("connection");
  setAttrs(el, { "data-state": state });
  setText(el, state === "live" ? "Live" : "Reconnecting…");
  setAttrs(el, { title: message || null });
  setText(byId("connection-detail"), state === "live" ? "" : message);
}

/** Shows an action's answer: the server's message, verbatim. */
export function showResult(outcome: "ok" | "refused" | "pending", message: string): void {
  const el = byId("action-result");
  setAttrs(el, { "data-outcome": outcome, hidden: false });
  setText(el, message);
}

export function clearResult(): void {
  const el = byId("action-result");
  setAttrs(el, { "data-outcome": null, hidden: true });
  setText(el, "");
}

const PHASE_ICONS: Record<string, string> = {
  Pending: "○", Progressing: "◐", Paused: "‖", WaitingForApproval: "⚑", RollingBack: "↺",
  Succeeded: "✓", Failed: "✗", Aborted: "■", RolledBack: "↶",
};

/** Fills a phase badge: icon and word (never colour alone); `data-phase` carries the colour in CSS. */
export function setPhase(el: HTMLElement, phase: string): void {
  if (el.dataset["phase"] === phase && el.childNodes.length > 0) return;
  setAttrs(el, { "data-phase": phase, class: "phase" });
  el.replaceChildren(h("span", { class: "i", "aria-hidden": "true" }, (Object.hasOwn(PHASE_ICONS, phase) ? PHASE_ICONS[phase] : "•")), " ", phase || "Unknown");
}

/** "3/10 batches". */
export function batchText(s: Summary): string {
  return `${s.batch ?? 0}/${s.totalBatches} batches`;
}

/** Fills a "waiting for" cell: the kind as a word, then the message. */
export function setWaiting(el: HTMLElement, s: Summary): void {
  const kind = s.waitingFor?.kind ?? "none";
  const msg = s.waitingFor?.message ?? "";
  const key = `${kind}\u0000${msg}`;
  if (el.dataset["key"] === key) return;
  el.dataset["key"] = key;
  el.dataset["kind"] = kind;
  if (kind === "none") el.replaceChildren(h("span", { class: "muted" }, "—"));
  else el.replaceChildren(h("span", { class: "kind", "data-kind": kind }, kind), " ", h("span", { class: "msg" }, msg));
}
