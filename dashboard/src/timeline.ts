// Conditions and Kubernetes Events merged into one list, oldest first.

import { h, time } from "./dom.js";
import type { Condition, TimelineEvent } from "./types.js";

interface Item { at: number; time: string; kind: "condition" | "event"; type: string; reason: string; message: string; count: number }

export class Timeline {
  private conditions: Condition[] = [];
  private events: TimelineEvent[] = [];
  private shown = "";

  constructor(private readonly el: HTMLOListElement) {
    this.render();
  }

  setConditions(c: Condition[] | undefined): void { this.conditions = c ?? []; this.render(); }
  setEvents(e: TimelineEvent[] | undefined): void { this.events = e ?? []; this.render(); }

  private render(): void {
    // The stream repeats the rollout on every status write: rebuild only when these changed.
    const key = JSON.stringify([this.conditions, this.events]);
    if (key === this.shown) return;
    this.shown = key;
    const at = (t: string | undefined): number => { const v = t ? Date.parse(t) : Number.NaN; return Number.isFinite(v) ? v : 0; };
    const items: Item[] = [
      ...this.conditions.map((c): Item => ({
        at: at(c.lastTransitionTime), time: c.lastTransitionTime ?? "", kind: "condition",
        type: `${c.type}=${c.status}`, reason: c.reason ?? "", message: c.message ?? "", count: 1,
      })),
      ...this.events.map((e): Item => ({
        at: at(e.time), time: e.time, kind: "event", type: e.type, reason: e.reason, message: e.message, count: e.count ?? 1,
      })),
    ].sort((a, b) => a.at - b.at); // stable: conditions before events at the same instant
    if (items.length === 0) {
      this.el.replaceChildren(h("li", { class: "empty" }, "No conditions or events yet."));
      return;
    }
    this.el.replaceChildren(...items.map((it) => h("li", { "data-kind": it.kind, "data-type": it.kind === "event" ? it.type : "Condition" },
      h("span", { class: "when" }, time(it.time)),
      h("span", { class: "type" }, it.kind === "event" && it.type === "Warning" ? h("span", { "aria-hidden": "true" }, "⚠ ") : null, it.type),
      h("span", { class: "reason" }, it.reason),
      h("span", { class: "msg" }, it.message, it.count > 1 ? h("span", { class: "muted" }, ` ×${it.count}`) : null))));
  }
}
