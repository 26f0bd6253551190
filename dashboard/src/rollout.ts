// One rollout: summary, holds, actions, the targets grid, analysis, plan and preview, timeline; kept live
// from /api/streams/rollouts/<ns>/<name>.

import { ACTION_LABELS, runAction } from "./actions.js";
import { openStream, type ApiError } from "./api.js";
import { renderAnalysis } from "./charts.js";
import { dl, fill, h, setText, time, type Child } from "./dom.js";
import { GridView } from "./grid.js";
import { batchText, received, rendered, setCellCount, setConnection, setPhase, setWaiting } from "./page.js";
import { previewForm, renderPlan } from "./plan.js";
import { Timeline } from "./timeline.js";
import {
  FINAL_PHASES, type Action, type Connection, type Grid, type RolloutEvent, type RolloutStatus, type TimelineEvent,
} from "./types.js";

const ACTIONS: Action[] = ["approve", "pause", "resume", "abort", "rollback"];

/** Builds the view into `main`; returns its close(). */
export function rolloutView(main: HTMLElement, namespace: string, name: string): () => void {
  const id = `${namespace}/${name}`;
  const phase = h("span", { id: "phase", class: "phase" });
  const gone = h("p", { id: "gone", class: "notice", role: "alert", hidden: true });
  const summary = h("div", { id: "summary" });
  const holds = h("div", { id: "holds" });
  const buttons = new Map<Action, HTMLButtonElement>(ACTIONS.map((a) => [a,
    h("button", { type: "button", "data-action": a, class: a === "abort" || a === "rollback" ? "danger" : a === "approve" ? "primary" : "", disabled: true }, ACTION_LABELS[a])]));
  const legend = h("ul", { id: "legend", class: "legend", "aria-label": "Legend: target states" });
  const gridEl = h("div", { id: "grid", role: "grid", "aria-label": "Targets by wave, cluster and batch; arrow keys move, Enter tells more", "aria-describedby": "legend" },
    h("p", { class: "empty" }, "Loading…"));
  const detail = h("p", { id: "cell-detail", role: "status", hidden: true });
  const analysis = h("div", { id: "analysis" });
  const plan = h("div", { id: "plan" }, h("p", { class: "muted" }, "Loading…"));
  const timelineEl = h("ol", { id: "timeline" });

  const section = h("section", { id: "rollout", "data-rollout": id },
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "← All rollouts")),
    h("div", { class: "title" },
      h("h1", { tabindex: -1 }, h("span", { class: "ns" }, namespace, " / "), name), phase),
    gone,
    h("div", { class: "actions", role: "group", "aria-label": "Actions" }, ...buttons.values()),
    h("section", { class: "card overview", "aria-labelledby": "status-h" }, h("h2", { id: "status-h", class: "vh" }, "Status"), summary, holds),
    h("section", { class: "card", "aria-labelledby": "targets-h" },
      h("div", { class: "card-head" }, h("h2", { id: "targets-h" }, "Targets"), legend), gridEl, detail),
    h("section", { class: "card", "aria-labelledby": "analysis-h" }, h("h2", { id: "analysis-h" }, "Analysis"), analysis),
    h("div", { class: "two" },
      h("section", { class: "card", "aria-labelledby": "plan-h" }, h("h2", { id: "plan-h" }, "Plan"), plan),
      h("section", { class: "card", "aria-labelledby": "preview-h" }, h("h2", { id: "preview-h" }, "Preview a manifest's plan"), previewForm(namespace))),
    h("section", { class: "card", "aria-labelledby": "timeline-h" }, h("h2", { id: "timeline-h" }, "Timeline"), timelineEl));
  main.replaceChildren(section);

  const grid = new GridView(gridEl, legend, detail);
  const timeline = new Timeline(timelineEl);
  let last: RolloutEvent | null = null;
  let analysisKey = "";
  let isGone = false;

  const refreshButtons = (): void => {
    const st = last?.object?.status;
    const ph = last?.summary?.phase ?? st?.phase ?? "";
    const final = FINAL_PHASES.has(ph);
    const paused = last?.object?.spec?.paused === true;
    const off = !last || isGone;
    // Enabled while an approval is awaited, whoever looks: pressed by someone the API server's dry run
    // refused, it shows the API server's reason in its own words.
    const awaited = ph === "WaitingForApproval" && st?.pendingApproval != null;
    const approve = buttons.get("approve")!;
    approve.disabled = off || !awaited;
    approve.title = awaited && !last?.mayApprove ? "The API server's dry run says you may not approve it" : "";
    buttons.get("pause")!.disabled = off || final || paused;
    buttons.get("resume")!.disabled = off || final || !paused;
    buttons.get("abort")!.disabled = off || final;
    // A finished rollout can still be rolled back (the operator restores what it changed), once.
    const restorable = (last?.summary?.counts?.updated ?? 0) > 0 && ph !== "RolledBack" && ph !== "RollingBack";
    buttons.get("rollback")!.disabled = off || last?.object?.spec?.rollback === true || (final && !restorable);
  };

  section.querySelector(".actions")!.addEventListener("click", (e) => {
    const btn = (e.target as Element).closest<HTMLButtonElement>("button[data-action]");
    if (!btn || btn.disabled) return;
    const action = btn.dataset["action"] as Action;
    const pa = last?.object?.status?.pendingApproval;
    void runAction({
      action, namespace, name,
      approval: action === "approve" && pa ? { batch: pa.batch, planHash: pa.planHash, gatesHash: pa.gatesHash } : undefined,
    });
  });

  const onRollout = (ev: RolloutEvent): void => {
    last = ev;
    isGone = false;
    gone.hidden = true;
    const s = ev.summary;
    const st: RolloutStatus = ev.object?.status ?? {};
    setPhase(phase, s.phase);
    const waiting = h("span");
    setWaiting(waiting, s);
    const total = s.counts?.total ?? s.totalTargets;
    summary.replaceChildren(dl([
      ["Progress", h("span", null, h("progress", { max: Math.max(total, 1), value: Math.min(s.counts?.updated ?? 0, total), "aria-label": "targets updated" }),
        ` ${s.counts?.updated ?? 0}/${total} targets updated · ${batchText(s)}`)],
      ["Targets", `${s.counts?.healthy ?? 0} healthy · ${s.counts?.failed ?? 0} failed · ${s.counts?.skipped ?? 0} skipped · ${s.counts?.refused ?? 0} refused`],
      ["Wave", s.wave ?? "—"],
      ["Waiting for", waiting],
      ["Image", h("code", null, s.image)],
      ["Creator", s.creator ?? "—"],
      ["Created", time(s.createdAt)],
      ["Message", s.message],
    ], "summary"));
    fill(holds, ...holdsOf(st));
    refreshButtons();
    grid.setBatches(st.batches, st.currentBatch);
    grid.setFailures(st.failures);
    const key = JSON.stringify(st.batches?.map((b) => b.analysis ?? null) ?? []);
    if (key !== analysisKey) { analysisKey = key; renderAnalysis(analysis, st.batches); }
    timeline.setConditions(st.conditions);
  };

  const onGrid = (g: Grid): void => {
    const samePlan = g.planHash !== "" && g.planHash === grid.planHash;
    received();
    grid.render(g);
    if (!samePlan) renderPlan(plan, g, (i) => grid.label(i));
    const st = last?.object?.status;
    if (st) { grid.setBatches(st.batches, st.currentBatch); grid.setFailures(st.failures); }
    setCellCount(grid.size);
    rendered(grid.size);
  };

  const close = openStream(`/api/streams/rollouts/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`, {
    event(kind, data) {
      switch (kind) {
        case "connection": { const c = data as Connection; setConnection(c.state, c.message); break; }
        case "rollout": onRollout(data as RolloutEvent); break;
        case "grid": onGrid(data as Grid); break;
        case "cells": grid.apply((data as { changes: [number, string][] }).changes ?? []); break;
        case "events": timeline.setEvents((data as { events: TimelineEvent[] }).events); break;
        case "gone":
          isGone = true;
          gone.hidden = false;
          setText(gone, `${id} was deleted.`);
          refreshButtons();
          break;
      }
    },
    lost(why, ms) { setConnection("reconnecting", `Lost the dashboard (${why}); trying again in ${Math.round(ms / 1000)} s.`); },
    fatal(err: ApiError) {
      gone.hidden = false;
      setText(gone, err.message);
      setConnection("reconnecting", err.message);
      refreshButtons();
    },
  });
  return close;
}

/** What holds the rollout, and its recent failures, in words from status. */
function holdsOf(st: RolloutStatus): Child[] {
  const out: Child[] = [];
  const block = (title: string, body: Child): void => { out.push(h("div", { class: "hold" }, h("h3", null, h("span", { class: "i", "aria-hidden": "true" }, "⚑"), title), body)); };
  const pa = st.pendingApproval;
  if (pa) {
    block(`Batch ${pa.batch + 1} waits for an approval`, dl([
      ["Since", time(pa.since)],
      ["Plan", h("code", null, pa.planHash)],
      ["Gates", h("code", null, pa.gatesHash)],
      ["Approvers", (pa.approvers ?? []).length ? h("ul", null, ...(pa.approvers ?? []).map((a) => h("li", null,
        `${a.policy ? `policy ${a.policy}: ` : ""}${[...(a.users ?? []), ...(a.groups ?? []).map((g) => `group ${g}`)].join(", ")}${a.more ? " and more" : ""}`))) : null],
    ]));
  }
  const w = st.windowHold;
  if (w) block(w.invalid ? "Change windows cannot be read" : "Outside its change window", dl([
    ["Window", w.window], ["Owner", w.owner], ["Kind", w.kind], ["Opens", w.opensAt ? time(w.opensAt) : null], ["Why", w.invalid],
  ]));
  const p = st.policyHold;
  if (p) block("Held by a policy", dl([["Policy", p.policy], ["Rule", p.rule], ["Why", p.message]]));
  const r = st.rightsHold;
  if (r) block("The API server refused a change made as the creator", dl([["Batch", r.batch !== undefined ? String(r.batch + 1) : null], ["Why", r.message]]));
  if (st.creatorHold) block("The operator cannot act as the creator", h("p", null, st.creatorHold));
  for (const b of st.batches ?? []) {
    const hold = b.analysis?.hold;
    if (hold) block(`Batch ${b.index + 1}: analysis hold`, dl([["Reason", hold.reason], ["Since", time(hold.since)]]));
  }
  const rb = st.rollback;
  if (rb) block(`Rollback ${rb.state ?? ""}`, dl([["Reason", rb.reason], ["Restored", String(rb.restored ?? 0)], ["Skipped", String(rb.skipped ?? 0)]]));
  for (const t of st.clusters?.trouble ?? []) block(`Member cluster ${t.name}: ${t.reason ?? "trouble"}`, h("p", null, t.message ?? ""));
  const f = st.failures ?? [];
  if (f.length) {
    out.push(h("details", { class: "failures" },
      h("summary", null, `${f.length} recent failure${f.length === 1 ? "" : "s"}`),
      h("ul", null, ...f.map((x) => h("li", null,
        h("strong", null, `${x.cluster ? `${x.cluster}:` : ""}${x.namespace ? `${x.namespace}/` : ""}${x.name ?? ""}`),
        ` · batch ${(x.batch ?? 0) + 1} · ${x.reason ?? ""}: ${x.message ?? ""}`)))));
  }
  return out;
}
