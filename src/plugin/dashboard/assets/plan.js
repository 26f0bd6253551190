// The plan (batches and their targets, from the grid), and the preview of a pasted manifest.
import { ApiError, post } from "./api.js";
import { fill, h, setAttrs, setText } from "./dom.js";
const MAX_MANIFEST = 256 * 1024;
/** One collapsed <details> per batch; its target list is only built when opened (10,000 targets). */
function batchList(batches) {
    const box = h("div", { class: "plan-batches" });
    const lists = new Map();
    for (const b of batches) {
        const where = [b.wave ? `wave ${b.wave}` : "", b.clusters.length ? `cluster${b.clusters.length > 1 ? "s" : ""} ${b.clusters.join(", ")}` : ""].filter(Boolean).join(" · ");
        const d = h("details", { "data-batch": b.index }, h("summary", null, h("strong", null, `Batch ${b.index + 1}`), ` · ${b.count} target${b.count === 1 ? "" : "s"}`, where ? h("span", { class: "muted" }, ` · ${where}`) : null));
        lists.set(d, b);
        box.append(d);
    }
    // `toggle` does not bubble, but a capturing listener on the box sees it.
    box.addEventListener("toggle", (e) => {
        const d = e.target;
        const b = lists.get(d);
        if (!b || !d.open || d.querySelector("ol"))
            return;
        d.append(h("ol", { class: "targets" }, ...b.targets().map((t) => h("li", null, t))));
    }, true);
    return box;
}
export function renderPlan(el, grid, labels) {
    const byBatch = new Map();
    const members = (grid.groups ?? []).some((g) => g.cluster);
    for (const g of grid.groups ?? []) {
        const b = byBatch.get(g.batch) ?? { wave: g.wave, clusters: [], ranges: [], count: 0 };
        const c = g.cluster || "(this cluster)";
        if (members && !b.clusters.includes(c))
            b.clusters.push(c);
        b.ranges.push([g.start, g.count]);
        b.count += g.count;
        byBatch.set(g.batch, b);
    }
    const batches = [...byBatch].sort(([a], [b]) => a - b).map(([index, b]) => ({
        index, wave: b.wave, clusters: b.clusters, count: b.count,
        targets: () => b.ranges.flatMap(([s, n]) => Array.from({ length: n }, (_, k) => labels(s + k))),
    }));
    const total = grid.targets?.length ?? 0;
    el.replaceChildren(h("p", { class: "muted" }, `${total} target${total === 1 ? "" : "s"} in ${batches.length} batch${batches.length === 1 ? "" : "es"} · plan `, h("code", null, grid.planHash || "—")), batchList(batches));
}
/** The preview form: POST /api/plan with the pasted manifest; the batches, or the error verbatim. */
export function previewForm(namespace) {
    const text = h("textarea", { id: "preview-manifest", rows: 8, spellcheck: false, placeholder: "apiVersion: fleetroll.dev/v1…\nkind: FleetRollout\n…" });
    const ns = h("input", { id: "preview-namespace", type: "text", value: namespace, autocomplete: "off", spellcheck: false });
    const run = h("button", { id: "preview-run", type: "button" }, "Preview plan");
    const out = h("div", { id: "preview-result", role: "status", "aria-live": "polite" });
    run.addEventListener("click", async () => {
        const body = text.value;
        if (new Blob([body]).size > MAX_MANIFEST) {
            setAttrs(out, { "data-outcome": "refused" });
            out.replaceChildren(h("p", { class: "error" }, "The manifest is larger than 256 KiB."));
            return;
        }
        run.disabled = true;
        setAttrs(out, { "data-outcome": "pending" });
        setText(out, "Planning…");
        try {
            const q = ns.value.trim() ? `?namespace=${encodeURIComponent(ns.value.trim())}` : "";
            const p = await post(`/api/plan${q}`, body, "text/plain");
            setAttrs(out, { "data-outcome": "ok" });
            const bs = p.batches ?? [];
            fill(out, h("p", null, `${p.totalTargets} target${p.totalTargets === 1 ? "" : "s"} in ${bs.length} batch${bs.length === 1 ? "" : "es"} · plan `, h("code", null, p.planHash)), (p.notes ?? []).length ? h("ul", { class: "notes" }, ...(p.notes ?? []).map((n) => h("li", null, n))) : null, batchList(bs.map((b) => ({ index: b.index, wave: b.wave, clusters: [], count: b.targets.length, targets: () => b.targets }))));
        }
        catch (e) {
            setAttrs(out, { "data-outcome": "refused" });
            out.replaceChildren(h("p", { class: "error" }, e instanceof ApiError ? e.message : String(e)));
        }
        finally {
            run.disabled = false;
        }
    });
    return h("div", { class: "preview" }, h("label", { for: "preview-manifest" }, "A FleetRollout manifest (YAML or JSON)"), text, h("div", { class: "row" }, h("label", { for: "preview-namespace" }, "Namespace, if the manifest names none"), ns, run), out);
}
