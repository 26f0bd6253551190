// What waits for this user's approval (the whole list arrives each time it changes).

import { runAction } from "./actions.js";
import { h, rolloutHref, setText, time } from "./dom.js";
import type { Waiting } from "./types.js";

export class Inbox {
  readonly el: HTMLElement;
  private readonly list = h("ul", { class: "inbox-list" });
  private readonly empty = h("p", { class: "empty" }, "Nothing waits for your approval.");
  private readonly count = h("span", { class: "badge", hidden: true });
  private items = new Map<string, Waiting>();

  constructor() {
    this.el = h("section", { id: "inbox", class: "card", "aria-labelledby": "inbox-h" },
      h("div", { class: "card-head" }, h("h2", { id: "inbox-h" }, "Waiting for your approval"), this.count),
      this.empty, this.list);
    this.list.addEventListener("click", (e) => {
      const btn = (e.target as Element).closest<HTMLButtonElement>("button[data-action=approve]");
      const w = btn && this.items.get(btn.closest("li")?.dataset["rollout"] ?? "");
      if (!btn || !w) return;
      // The inbox counts batches from 1 (as `kubectl fleetroll inbox`); the approval cites them from 0.
      void runAction({
        action: "approve", namespace: w.namespace, name: w.name,
        approval: { batch: w.batch - 1, planHash: w.planHash, gatesHash: w.gatesHash },
      });
    });
  }

  set(waiting: Waiting[]): void {
    // Told apart from "not heard yet": an empty inbox is an answer once this is set.
    this.el.dataset["received"] = "true";
    // Rebuilt whole (it is short), but a focused Approve button keeps the focus when its entry stays.
    const focused = (document.activeElement as HTMLElement | null)?.closest("li")?.dataset["rollout"];
    this.items = new Map(waiting.map((w) => [`${w.namespace}/${w.name}`, w]));
    this.list.replaceChildren(...waiting.map((w) => h("li", { "data-rollout": `${w.namespace}/${w.name}` },
      h("a", { href: rolloutHref(w.namespace, w.name) }, `${w.namespace}/${w.name}`),
      h("span", { class: "muted" }, `batch ${w.batch} of ${w.batches}`),
      w.creator ? h("span", { class: "muted" }, `created by ${w.creator}`) : null,
      h("span", { class: "muted" }, "waiting since ", time(w.since)),
      h("button", { type: "button", "data-action": "approve", class: "primary" }, "Approve"))));
    if (focused && this.list.contains(document.activeElement) === false) {
      this.list.querySelector<HTMLElement>(`li[data-rollout="${CSS.escape(focused)}"] button`)?.focus();
    }
    this.empty.hidden = waiting.length > 0;
    this.count.hidden = waiting.length === 0;
    setText(this.count, String(waiting.length));
  }
}
