// The targets grid: waves → clusters → batches → cells. Built once per plan into a fragment; `cells`
// updates are coalesced per animation frame through an index→element array; one listener per kind of
// event for the whole grid; a roving tabindex (one cell in the tab order, arrows move it).

import { fill, h, setAttrs, setText } from "./dom.js";
import type { BatchStatus, CellState, Failure, Grid, GridGroup } from "./types.js";

export const STATES: readonly CellState[] = ["pending", "changing", "soaking", "healthy", "failed", "refused", "skipped", "restored"];
const ICONS: Record<CellState, string> = {
  pending: "○", changing: "◐", soaking: "◷", healthy: "✓", failed: "✗", refused: "⊘", skipped: "–", restored: "↺",
};
// Up to this many targets each cell has room for the target's name and its state as visible words.
const ROOMY_MAX = 200;

const norm = (s: string): CellState => (Object.hasOwn(ICONS, s) ? (s as CellState) : "pending");

/** A cell knows its index as a property, not an attribute: 10,000 fewer attributes to write. */
type Cell = HTMLElement & { idx: number };

export class GridView {
  /** index → cell element, in grid order. */
  private cells: Cell[] = [];
  private states: CellState[] = [];
  private labels: string[] = [];
  private previous: string[] = [];
  private groups: GridGroup[] = [];
  /** index → its group's position in `groups`. */
  private groupOf = new Int32Array(0);
  private batchMeta = new Map<number, HTMLElement[]>();
  private counts = new Map<CellState, number>();
  private legendCounts = new Map<CellState, HTMLElement>();
  private pending = new Map<number, CellState>();
  private frame = 0;
  private active = 0;
  private detailIndex = -1;
  private failures: Failure[] = [];
  planHash = "";

  constructor(
    private readonly el: HTMLElement,
    legend: HTMLElement,
    private readonly detail: HTMLElement,
  ) {
    legend.replaceChildren(...STATES.map((st) => {
      const n = h("span", { class: "n" }, "0");
      this.legendCounts.set(st, n);
      return h("li", { "data-state": st }, h("span", { class: "i", "aria-hidden": "true" }, ICONS[st]), " ", st, " ", n);
    }));
    el.addEventListener("click", (e) => {
      const i = this.indexOf(e.target);
      if (i >= 0) { this.move(i); this.showDetail(i); }
    });
    el.addEventListener("keydown", (e) => this.onKey(e));
  }

  get size(): number { return this.cells.length; }

  /** A cell's target as shown (`<ns>/<name>`, or `<cluster>/<ns>/<name>` in a member cluster). */
  label(i: number): string { return this.labels[i] ?? ""; }

  /** The whole grid (first, and whenever the plan changes). */
  render(grid: Grid): void {
    const targets = grid.targets ?? [];
    this.previous = grid.previousImages ?? [];
    this.pending.clear();
    // The same plan again (the stream re-opened): only states can differ; keep the elements and the focus.
    if (grid.planHash && grid.planHash === this.planHash && targets.length === this.cells.length) {
      targets.forEach((_, i) => this.pending.set(i, norm(grid.states?.[i] ?? "pending")));
      this.flush();
      return;
    }
    const keepTarget = this.labels[this.active];
    const hadFocus = this.el.contains(document.activeElement);
    this.planHash = grid.planHash;
    this.groups = grid.groups ?? [];
    const n = targets.length;
    this.states = new Array<CellState>(n);
    this.labels = new Array<string>(n);
    this.cells = new Array<Cell>(n);
    this.groupOf = new Int32Array(n);
    this.batchMeta.clear();
    this.counts = new Map(STATES.map((s) => [s, 0]));
    const roomy = n <= ROOMY_MAX;
    setAttrs(this.el, { "data-density": roomy ? "roomy" : "compact" });

    const waves = this.groups.some((g) => g.wave !== null && g.wave !== undefined);
    const clusters = this.groups.some((g) => g.cluster);
    const level = (depth: number): "h3" | "h4" | "h5" => (depth === 0 ? "h3" : depth === 1 ? "h4" : "h5");
    const frag = document.createDocumentFragment();
    // A template cloned per cell: the icon (first child, a text node), the name when there is room, and
    // the state as a word (last child; visually hidden in the compact grid, whose cells have aria-label).
    // Spaces between the words: the visible text then reads as the aria-label does (label in name).
    const tpl = h("span", { role: "gridcell", class: "cell" }, "○",
      roomy ? [" ", h("span", { class: "t" }), " "] : null, h("span", { class: roomy ? "w" : "vh" }));
    let wave: string | null | undefined = undefined;
    let cluster: string | undefined = undefined;
    const depth = (waves ? 1 : 0) + (clusters ? 1 : 0);
    let container: HTMLElement | DocumentFragment = frag;
    let waveBox: HTMLElement | DocumentFragment = frag;
    this.groups.forEach((g, gi) => {
      if (waves && (gi === 0 || g.wave !== wave)) {
        wave = g.wave;
        cluster = undefined;
        waveBox = h("div", { class: "wave" },
          h("div", { role: "row", class: "gh" }, h("div", { role: "rowheader" }, h("h3", null, "Wave ", h("span", { class: "v" }, g.wave ?? "(none)")))));
        frag.append(waveBox);
        container = waveBox;
      }
      if (clusters && (cluster === undefined || g.cluster !== cluster)) {
        cluster = g.cluster;
        container = h("div", { class: "cluster" },
          h("div", { role: "row", class: "gh" }, h("div", { role: "rowheader" },
            h(level(waves ? 1 : 0), null, g.cluster ? ["Cluster ", h("span", { class: "v" }, g.cluster)] : "This cluster"))));
        waveBox.append(container);
      }
      const meta = h("span", { class: "meta" });
      const list = this.batchMeta.get(g.batch) ?? [];
      list.push(meta);
      this.batchMeta.set(g.batch, list);
      const box = h("div", { class: "cells" });
      const row = h("div", { role: "row", class: "batch", "data-batch": g.batch },
        h("div", { role: "rowheader", class: "bh" }, h(level(depth), null, `Batch ${g.batch + 1}`), " ", meta, " ", h("span", { class: "muted" }, `${g.count} target${g.count === 1 ? "" : "s"}`)),
        box);
      const end = Math.min(g.start + g.count, n);
      for (let i = g.start; i < end; i++) {
        const label = targets[i] ?? "";
        const st = norm(grid.states?.[i] ?? "pending");
        const c = tpl.cloneNode(true) as Cell;
        c.idx = i;
        c.dataset["target"] = label;
        this.labels[i] = label;
        this.cells[i] = c;
        this.groupOf[i] = gi;
        if (roomy) (c.children[0] as HTMLElement).textContent = label;
        this.paint(c, label, st);
        this.states[i] = st;
        this.counts.set(st, (this.counts.get(st) ?? 0) + 1);
        box.append(c);
      }
      container.append(row);
    });
    // A grid with holes (indexes no group covers) still gets an element per index.
    for (let i = 0; i < n; i++) {
      if (!this.cells[i]) { this.cells[i] = Object.assign(h("span"), { idx: i }); this.states[i] = "pending"; this.labels[i] = targets[i] ?? ""; }
    }
    if (n === 0) frag.append(h("p", { class: "empty" }, grid.note || "No targets planned yet."));
    this.el.replaceChildren(frag);
    const kept = keepTarget === undefined ? -1 : this.labels.indexOf(keepTarget);
    this.active = kept >= 0 ? kept : 0;
    this.cells[this.active]?.setAttribute("tabindex", "0");
    if (hadFocus) this.cells[this.active]?.focus({ preventScroll: true });
    this.updateLegend();
    if (this.detailIndex >= 0) this.showDetail(kept >= 0 ? kept : -1);
  }

  /** Cells whose state changed: applied on the next animation frame, the last state of each winning. */
  apply(changes: [number, string][]): void {
    for (const [i, st] of changes) if (i >= 0 && i < this.cells.length) this.pending.set(i, norm(st));
    if (!this.frame && this.pending.size) this.frame = requestAnimationFrame(() => this.flush());
  }

  private flush(): void {
    this.frame = 0;
    for (const [i, st] of this.pending) {
      const old = this.states[i];
      if (old === st || old === undefined) continue;
      this.states[i] = st;
      this.counts.set(old, (this.counts.get(old) ?? 1) - 1);
      this.counts.set(st, (this.counts.get(st) ?? 0) + 1);
      this.paint(this.cells[i]!, this.labels[i]!, st);
      if (i === this.detailIndex) this.showDetail(i);
    }
    this.pending.clear();
    this.updateLegend();
  }

  private paint(c: HTMLElement, label: string, st: CellState): void {
    const text = `${label}: ${st}`;
    c.dataset["state"] = st;
    c.setAttribute("aria-label", text);
    c.title = text;
    if (c.firstChild) c.firstChild.nodeValue = ICONS[st];
    if (c.lastChild) c.lastChild.textContent = st;
  }

  private updateLegend(): void {
    for (const st of STATES) setText(this.legendCounts.get(st)!, String(this.counts.get(st) ?? 0));
  }

  /** The batches' states from status, beside their headings. */
  setBatches(batches: BatchStatus[] | undefined, current: number | undefined): void {
    const byIndex = new Map((batches ?? []).map((b) => [b.index, b]));
    for (const [batch, metas] of this.batchMeta) {
      const b = byIndex.get(batch);
      const text = [batch === current ? "current" : "", b?.state ?? ""].filter(Boolean).join(" · ");
      for (const m of metas) { setText(m, text); m.dataset["state"] = b?.state ?? ""; }
    }
  }

  setFailures(f: Failure[] | undefined): void {
    this.failures = f ?? [];
    if (this.detailIndex >= 0) this.showDetail(this.detailIndex);
  }

  private indexOf(target: EventTarget | null): number {
    const c = (target as Element | null)?.closest?.(".cell") as Cell | null | undefined;
    return c && typeof c.idx === "number" ? c.idx : -1;
  }

  private move(i: number, focus = true): void {
    const next = this.cells[i];
    if (!next) return;
    if (i !== this.active) {
      this.cells[this.active]?.removeAttribute("tabindex");
      this.active = i;
    }
    next.setAttribute("tabindex", "0");
    if (focus) next.focus();
  }

  /** What a cell says, in words: target, state, where it is, and its failure when status names one. */
  private showDetail(i: number): void {
    this.detailIndex = i;
    const g = this.groups[this.groupOf[i] ?? -1];
    const label = this.labels[i];
    if (i < 0 || !g || label === undefined) { this.detail.replaceChildren(); this.detail.hidden = true; return; }
    const st = this.states[i]!;
    // The newest record of this target, named as the server names it: [cluster/]namespace/name.
    const key = (f: Failure): string => `${f.cluster ? f.cluster + "/" : ""}${f.namespace ? f.namespace + "/" : ""}${f.name ?? ""}`;
    let fail: Failure | undefined;
    for (let k = this.failures.length - 1; k >= 0 && !fail; k--) if (key(this.failures[k]!) === label) fail = this.failures[k];
    this.detail.hidden = false;
    fill(this.detail,
      h("strong", null, label), " ",
      h("span", { class: "state", "data-state": st }, h("span", { class: "i", "aria-hidden": "true" }, ICONS[st]), " ", st),
      h("span", { class: "muted" }, ` · batch ${g.batch + 1}${g.cluster ? ` · cluster ${g.cluster}` : ""}${g.wave ? ` · wave ${g.wave}` : ""}`),
      this.previous[i] ? h("span", { class: "muted" }, " · was ", h("code", null, this.previous[i]!)) : null,
      fail ? h("span", { class: "fail" }, ` · ${fail.reason ?? "Failed"}: ${fail.message ?? ""}`) : null);
  }

  private onKey(e: KeyboardEvent): void {
    const i = this.indexOf(e.target);
    if (i < 0) return;
    const n = this.cells.length;
    const g = this.groups[this.groupOf[i]!];
    if (!g) return;
    const first = g.start;
    const last = Math.min(g.start + g.count, n) - 1;
    let to = -1;
    switch (e.key) {
      case "ArrowRight": to = Math.min(i + 1, n - 1); break;
      case "ArrowLeft": to = Math.max(i - 1, 0); break;
      case "ArrowDown": to = this.vertical(i, 1); break;
      case "ArrowUp": to = this.vertical(i, -1); break;
      case "PageDown": to = this.jumpGroup(i, 1); break;
      case "PageUp": to = this.jumpGroup(i, -1); break;
      case "Home": to = e.ctrlKey ? 0 : first; break;
      case "End": to = e.ctrlKey ? n - 1 : last; break;
      case "Enter": case " ": this.showDetail(i); e.preventDefault(); return;
      default: return;
    }
    e.preventDefault();
    this.move(to);
  }

  /**
   * The cell above or below: on the next visual line (cells wrap, and roomy cells differ in width), the one
   * nearest horizontally; past a batch's first or last line, the nearest line of the batch beside it.
   */
  private vertical(i: number, dir: 1 | -1): number {
    const rect = (j: number): DOMRect => this.cells[j]!.getBoundingClientRect();
    const cur = rect(i);
    // Aim from near the cell's start: wide cells (long names) then still move column by column.
    const x = cur.left + Math.min(cur.width / 2, 12);
    const nearest = (from: number, lo: number, hi: number, skipTop: number | null): number => {
      let best = -1;
      let bestDx = Infinity;
      let top: number | null = null;
      for (let j = from; j >= lo && j < hi; j += dir) {
        const r = rect(j);
        if (top === null) {
          if (skipTop !== null && Math.abs(r.top - skipTop) < 1) continue;
          top = r.top;
        } else if (Math.abs(r.top - top) >= 1) break;
        const dx = x < r.left ? r.left - x : x > r.right ? x - r.right : 0;
        if (dx < bestDx) { bestDx = dx; best = j; }
      }
      return best;
    };
    const gi = this.groupOf[i]!;
    const g = this.groups[gi]!;
    const inGroup = nearest(i + dir, g.start, g.start + g.count, cur.top);
    if (inGroup >= 0) return inGroup;
    const o = this.groups[gi + dir];
    if (!o || o.count === 0) return i;
    const found = nearest(dir === 1 ? o.start : o.start + o.count - 1, o.start, o.start + o.count, null);
    return found >= 0 ? found : i;
  }

  private jumpGroup(i: number, dir: 1 | -1): number {
    const gi = this.groupOf[i]!;
    const o = this.groups[gi + dir];
    if (!o || o.count === 0) return i;
    return o.start + Math.min(i - this.groups[gi]!.start, o.count - 1);
  }
}
