// The only way this page makes elements: cluster data becomes text nodes, and attributes come from an
// allowlist, so a value such as `"><script>` or `<img onerror=…>` can only ever show up as text.
const PLAIN = new Set([
    "id", "class", "href", "title", "role", "tabindex", "type", "for", "name", "value", "max", "min",
    "datetime", "hidden", "disabled", "open", "placeholder", "rows", "spellcheck", "autocomplete", "lang",
    "start", "scope", "viewBox", "width", "height", "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "d", "points",
    "focusable", "preserveAspectRatio",
]);
const SVG_NS = "http://www.w3.org/2000/svg";
/** Sets (or, for null/undefined/false, removes) allowed attributes; anything else is a bug and throws. */
export function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs)) {
        if (!PLAIN.has(k) && !/^(aria|data)-[a-z][a-z0-9-]*$/.test(k))
            throw new Error(`attribute ${k} not allowed`);
        // Links only ever point inside the page (hash routes); a cluster value never becomes a URL scheme.
        if (k === "href" && typeof v === "string" && !v.startsWith("#"))
            throw new Error("href must be a #route");
        if (v === null || v === undefined || v === false)
            el.removeAttribute(k);
        else
            el.setAttribute(k, v === true ? "" : String(v));
    }
}
function append(el, children) {
    for (const c of children) {
        if (c === null || c === undefined || c === false)
            continue;
        if (Array.isArray(c))
            append(el, c);
        else
            el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
}
/** An HTML element with attributes and children (strings become text nodes). */
export function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    if (attrs)
        setAttrs(el, attrs);
    append(el, children);
    return el;
}
/** An SVG element, the same way. */
export function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    if (attrs)
        setAttrs(el, attrs);
    append(el, children);
    return el;
}
/** Replaces an element's content with text, touching the DOM only when it changes. */
export function setText(el, text) {
    if (el.textContent !== text)
        el.textContent = text;
}
/** Replaces an element's children. */
export function fill(el, ...children) {
    el.replaceChildren();
    append(el, children);
}
/** The element with this id, which index.html (or the current view) must have. */
export function byId(id) {
    const el = document.getElementById(id);
    if (!el)
        throw new Error(`#${id} missing`);
    return el;
}
const sameDay = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
const otherDay = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
});
/** A `<time>` in local time (the RFC 3339 value in `datetime` and `title`); unparsable text stays as it is. */
export function time(rfc3339) {
    if (!rfc3339)
        return "—";
    const d = new Date(rfc3339);
    if (Number.isNaN(d.getTime()))
        return rfc3339;
    const fmt = d.toDateString() === new Date().toDateString() ? sameDay : otherDay;
    return h("time", { datetime: rfc3339, title: rfc3339 }, fmt.format(d));
}
/** `#/r/<ns>/<name>`. */
export function rolloutHref(namespace, name) {
    return `#/r/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`;
}
/** A definition list of the pairs whose value is present. */
export function dl(pairs, cls) {
    const list = h("dl", { class: cls });
    for (const [k, v] of pairs) {
        if (v === null || v === undefined || v === "" || v === false)
            continue;
        list.append(h("dt", null, k), h("dd", null, v));
    }
    return list;
}
