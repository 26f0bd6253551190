// The table of every rollout the user can read: rows kept sorted by namespace/name and updated in place.
import { h, rolloutHref, setAttrs, setText } from "./dom.js";
import { batchText, setPhase, setWaiting } from "./page.js";
const key = (s) => `${s.namespace}/${s.name}`;
// Code-point order (as kubectl sorts), by namespace first: "a" before "a-b" whatever "/" sorts as.
const before = (a, b) => a.namespace < b.namespace || (a.namespace === b.namespace && a.name < b.name);
export class RolloutTable {
    el;
    tbody = h("tbody");
    rows = new Map();
    order = [];
    query = "";
    filter = h("input", {
        id: "filter", type: "search", placeholder: "name, phase, image…", autocomplete: "off", spellcheck: false,
    });
    shown = h("span", { id: "shown", class: "muted", "aria-live": "polite" });
    scope = h("span", { id: "scope", class: "muted" });
    empty = h("p", { id: "rollouts-empty", class: "empty", hidden: true });
    constructor() {
        const table = h("table", { id: "rollouts" }, h("caption", { class: "vh" }, "Rollouts; Tab to a row and press Enter to open it"), h("thead", null, h("tr", null, ...["Namespace", "Name", "Phase", "Progress", "Wave", "Waiting for", "Creator", "Image"]
            .map((t) => h("th", { scope: "col" }, t)))), this.tbody);
        this.el = h("section", { class: "card", "aria-labelledby": "rollouts-h" }, h("div", { class: "card-head" }, h("h1", { id: "rollouts-h", tabindex: -1 }, "Rollouts"), this.scope, h("label", { class: "filter" }, h("span", null, "Filter"), this.filter), this.shown), h("div", { class: "table-wrap" }, table), this.empty);
        this.filter.addEventListener("input", () => {
            this.query = this.filter.value.trim().toLowerCase();
            for (const r of this.order)
                this.applyFilter(r);
            this.count();
        });
        // One listener for every row: Enter or a click opens it, arrows move between rows.
        this.tbody.addEventListener("keydown", (e) => this.onKey(e));
        this.tbody.addEventListener("click", (e) => {
            const tr = e.target.closest("tr");
            if (tr && !e.target.closest("a, button"))
                open(tr);
        });
    }
    /** The whole list: replaces what the table had. */
    snapshot(scope, list) {
        setText(this.scope, `in ${scope}`);
        const keep = new Set(list.map(key));
        for (const [k, r] of this.rows)
            if (!keep.has(k))
                this.drop(k, r);
        if (this.rows.size === 0) {
            // The first load: build every row into a fragment and insert it once.
            const sorted = [...list].sort((a, b) => (before(a, b) ? -1 : before(b, a) ? 1 : 0));
            const frag = document.createDocumentFragment();
            for (const s of sorted) {
                if (this.rows.has(key(s)))
                    continue;
                const r = this.make(s);
                this.rows.set(key(s), r);
                this.order.push(r);
                frag.append(r.tr);
            }
            this.tbody.append(frag);
        }
        else {
            for (const s of list)
                this.upsert(s, false);
        }
        this.count();
    }
    upsert(s, recount = true) {
        const r = this.rows.get(key(s));
        if (r) {
            this.update(r, s);
        }
        else {
            const row = this.make(s);
            let lo = 0;
            let hi = this.order.length;
            while (lo < hi) {
                const mid = (lo + hi) >> 1;
                if (before(this.order[mid].s, s))
                    lo = mid + 1;
                else
                    hi = mid;
            }
            this.tbody.insertBefore(row.tr, this.order[lo]?.tr ?? null);
            this.order.splice(lo, 0, row);
            this.rows.set(key(s), row);
        }
        if (recount)
            this.count();
    }
    remove(namespace, name) {
        const k = key({ namespace, name });
        const r = this.rows.get(k);
        if (r)
            this.drop(k, r);
        this.count();
    }
    drop(k, r) {
        r.tr.remove();
        this.rows.delete(k);
        this.order = this.order.filter((o) => o !== r);
    }
    make(s) {
        const phase = h("span", { class: "phase" });
        const progress = h("progress");
        const batches = h("span", { class: "batches" });
        const wave = h("td", { class: "wave" });
        const waiting = h("td", { class: "waiting" });
        const creator = h("td", { class: "creator" });
        const image = h("code");
        const tr = h("tr", { "data-rollout": key(s), tabindex: 0 }, h("td", { class: "ns" }, s.namespace), h("td", { class: "name" }, h("a", { href: rolloutHref(s.namespace, s.name), tabindex: -1 }, s.name)), h("td", null, phase), h("td", { class: "progress" }, progress, " ", batches), wave, waiting, creator, h("td", { class: "image" }, image));
        const r = { s, tr, phase, progress, batches, wave, waiting, creator, image, haystack: "" };
        this.update(r, s, true);
        return r;
    }
    update(r, s, fresh = false) {
        if (!fresh && JSON.stringify(r.s) === JSON.stringify(s))
            return;
        r.s = s;
        setPhase(r.phase, s.phase);
        const total = Math.max(s.counts?.total ?? s.totalTargets ?? 0, 0);
        const updated = Math.min(Math.max(s.counts?.updated ?? 0, 0), total);
        setAttrs(r.progress, { max: Math.max(total, 1), value: updated, "aria-label": `${updated}/${total} targets updated`, title: `${updated}/${total} targets updated` });
        setText(r.batches, batchText(s));
        setText(r.wave, s.wave ?? "—");
        setWaiting(r.waiting, s);
        setText(r.creator, s.creator ?? "—");
        setText(r.image, s.image ?? "");
        setAttrs(r.image, { title: s.image ?? null });
        setAttrs(r.tr, { title: s.message ?? null });
        r.haystack = [s.namespace, s.name, s.phase, s.wave, s.waitingFor?.kind, s.waitingFor?.message, s.creator, s.image]
            .filter(Boolean).join("\n").toLowerCase();
        this.applyFilter(r);
    }
    applyFilter(r) {
        const hide = this.query !== "" && !r.haystack.includes(this.query);
        if (r.tr.hidden !== hide)
            r.tr.hidden = hide;
    }
    count() {
        const total = this.order.length;
        const visible = this.query ? this.order.filter((r) => !r.tr.hidden).length : total;
        setText(this.shown, this.query ? `${visible} of ${total} shown` : `${total} rollout${total === 1 ? "" : "s"}`);
        this.empty.hidden = visible > 0;
        setText(this.empty, total === 0 ? "No rollouts you can read." : "No rollout matches the filter.");
    }
    onKey(e) {
        const tr = e.target.closest("tr");
        if (!tr || e.target !== tr)
            return;
        if (e.key === "Enter") {
            e.preventDefault();
            open(tr);
            return;
        }
        if (e.key !== "ArrowDown" && e.key !== "ArrowUp")
            return;
        e.preventDefault();
        let next = tr;
        do
            next = e.key === "ArrowDown" ? next.nextElementSibling : next.previousElementSibling;
        while (next && next.hidden);
        next?.focus();
    }
}
function open(tr) {
    const href = tr.querySelector("a")?.getAttribute("href");
    if (href)
        location.hash = href;
}
