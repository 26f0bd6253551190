// Each batch's analysis: per metric, a small SVG chart of its measurements' values over time (shape
// by phase, never colour alone), and the same measurements as text beside it.
import { h, svg, time } from "./dom.js";
const W = 220;
const H = 64;
const PAD = { l: 40, r: 8, t: 8, b: 8 };
const METRIC_ICONS = {
    Running: "◐", Successful: "✓", Failed: "✗", Inconclusive: "?", Accepted: "≈",
};
/** The first number of a measurement's value ("the worst first when several"); ±Inf and NaN count. */
function numberOf(value) {
    const m = /[-+]?(?:Inf(?:inity)?|NaN|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)/i.exec(value ?? "");
    if (!m)
        return Number.NaN;
    const t = m[0].toLowerCase();
    if (t.endsWith("inf") || t.endsWith("infinity"))
        return t.startsWith("-") ? -Infinity : Infinity;
    return Number(m[0]);
}
/** A point's mark: circle (Successful), cross (Failed), diamond (Inconclusive), square (Error). */
function mark(phase, x, y) {
    const r = 3.5;
    switch (phase) {
        case "Failed": return svg("path", { d: `M${x - r} ${y - r}L${x + r} ${y + r}M${x - r} ${y + r}L${x + r} ${y - r}`, class: "pt failed" });
        case "Inconclusive": return svg("path", { d: `M${x} ${y - r}L${x + r} ${y}L${x} ${y + r}L${x - r} ${y}Z`, class: "pt inconclusive" });
        case "Error": return svg("path", { d: `M${x - r} ${y - r}h${2 * r}v${2 * r}h${-2 * r}Z`, class: "pt error" });
        default: return svg("circle", { cx: x, cy: y, r, class: "pt successful" });
    }
}
function chart(m) {
    const ms = m.measurements ?? [];
    const vals = ms.map((x) => numberOf(x.value));
    const finite = vals.filter(Number.isFinite);
    let lo = finite.length ? Math.min(...finite) : 0;
    let hi = finite.length ? Math.max(...finite) : 1;
    if (lo === hi) {
        const d = Math.abs(lo) * 0.1 || 1;
        lo -= d;
        hi += d;
    }
    const times = ms.map((x) => (x.at ? Date.parse(x.at) : Number.NaN));
    const useTime = times.every(Number.isFinite) && new Set(times).size === times.length && times.length > 1;
    const t0 = Math.min(...times);
    const t1 = Math.max(...times);
    const xOf = (i) => {
        const span = W - PAD.l - PAD.r;
        if (ms.length <= 1)
            return PAD.l + span / 2;
        return PAD.l + span * (useTime ? (times[i] - t0) / (t1 - t0) : i / (ms.length - 1));
    };
    const yOf = (v) => {
        // Off the scale (±Inf, NaN): drawn at the edge, the value is in the text beside.
        if (v === Infinity || Number.isNaN(v))
            return PAD.t;
        if (v === -Infinity)
            return H - PAD.b;
        return H - PAD.b - ((v - lo) / (hi - lo)) * (H - PAD.t - PAD.b);
    };
    const summary = ms.map((x) => `${x.value ?? "no value"} (${x.phase ?? "?"})`).join(", ");
    const s = svg("svg", {
        viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", class: "chart-svg",
        "aria-label": `${m.name}: ${summary || "no measurements yet"}`,
    });
    s.append(svg("line", { x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b, class: "axis" }));
    s.append(svg("line", { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b, class: "axis" }));
    const line = ms.map((_, i) => [xOf(i), yOf(vals[i])]).filter((_, i) => Number.isFinite(vals[i]));
    if (line.length > 1)
        s.append(svg("polyline", { points: line.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "), class: "line" }));
    ms.forEach((x, i) => {
        const p = mark(x.phase ?? "", xOf(i), yOf(vals[i]));
        p.append(svg("title", null, `${x.at ?? ""} ${x.phase ?? ""}: ${x.value ?? ""}${x.message ? ` — ${x.message}` : ""}`));
        s.append(p);
    });
    if (finite.length) {
        // The scale's ends, left of the plot.
        s.append(svg("text", { x: PAD.l - 6, y: PAD.t + 3, class: "tick end" }, String(+hi.toPrecision(4))));
        s.append(svg("text", { x: PAD.l - 6, y: H - PAD.b + 3, class: "tick end" }, String(+lo.toPrecision(4))));
    }
    return s;
}
function figure(m) {
    const phase = m.phase ?? "Running";
    const tally = `${m.successful ?? 0} successful · ${m.failed ?? 0} failed · ${m.inconclusive ?? 0} inconclusive · ${m.errors ?? 0} errors`;
    return h("figure", { class: "chart", "data-metric": m.name, "data-phase": phase }, h("figcaption", null, h("span", { class: "metric" }, m.name), " ", h("span", { class: "phase", "data-phase": phase }, h("span", { class: "i", "aria-hidden": "true" }, (Object.hasOwn(METRIC_ICONS, phase) ? METRIC_ICONS[phase] : "•")), " ", phase), m.dryRun ? h("span", { class: "muted" }, " (dry run)") : null), chart(m), h("p", { class: "muted tally" }, tally), h("ol", { class: "measurements" }, ...(m.measurements ?? []).map((x) => h("li", { "data-phase": x.phase ?? "" }, time(x.at), " ", h("span", { class: "mp" }, x.phase ?? ""), " ", h("code", null, x.value ?? ""), x.message ? h("span", { class: "muted" }, ` — ${x.message}`) : null))));
}
/** Renders every batch that has analysis, latest first; false when none has any. */
export function renderAnalysis(el, batches) {
    const withAnalysis = (batches ?? []).filter((b) => (b.analysis?.metrics?.length ?? 0) > 0 || b.analysis?.hold);
    if (withAnalysis.length === 0) {
        el.replaceChildren(h("p", { class: "empty" }, "No analysis measurements yet."));
        return;
    }
    el.replaceChildren(...[...withAnalysis].sort((a, b) => b.index - a.index).map((b) => {
        const hold = b.analysis?.hold;
        return h("section", { class: "batch-analysis", "data-batch": b.index }, h("h3", null, `Batch ${b.index + 1}`, b.analysis?.startedAt ? h("span", { class: "muted" }, " · measuring since ", time(b.analysis.startedAt)) : null), hold ? h("p", { class: "hold" }, h("span", { class: "i", "aria-hidden": "true" }, "⚑"), ` Held: ${hold.reason ?? ""} since `, time(hold.since)) : null, h("div", { class: "charts" }, ...(b.analysis?.metrics ?? []).map(figure)));
    }));
}
