// Entry: the token, the user, and hash routing between the list (#/) and one rollout (#/r/<ns>/<name>).
import { setUser } from "./actions.js";
import { ApiError, getJSON, initToken, openStream } from "./api.js";
import { byId, h } from "./dom.js";
import { Inbox } from "./inbox.js";
import { RolloutTable } from "./list.js";
import { clearResult, received, rendered, setConnection, viewStarted } from "./page.js";
import { rolloutView } from "./rollout.js";
const view = byId("view");
let closeView = null;
function homeView() {
    const inbox = new Inbox();
    const table = new RolloutTable();
    view.replaceChildren(inbox.el, table.el);
    return openStream("/api/streams/rollouts", {
        event(kind, data) {
            switch (kind) {
                case "connection": {
                    const c = data;
                    setConnection(c.state, c.message);
                    break;
                }
                case "snapshot": {
                    const s = data;
                    received();
                    table.snapshot(s.scope, s.rollouts ?? []);
                    rendered(0);
                    break;
                }
                case "upsert":
                    table.upsert(data);
                    break;
                case "remove": {
                    const r = data;
                    table.remove(r.namespace, r.name);
                    break;
                }
                case "inbox":
                    inbox.set(data.waiting ?? []);
                    break;
            }
        },
        lost(why, ms) { setConnection("reconnecting", `Lost the dashboard (${why}); trying again in ${Math.round(ms / 1000)} s.`); },
        fatal(err) { problem(err.message); },
    });
}
function problem(message) {
    setConnection("reconnecting", message);
    view.replaceChildren(h("p", { class: "notice", role: "alert" }, message));
}
function route() {
    closeView?.();
    closeView = null;
    clearResult();
    viewStarted();
    const m = /^#\/r\/([^/]+)\/([^/]+)$/.exec(location.hash);
    let ns = "";
    let name = "";
    try {
        ns = m?.[1] ? decodeURIComponent(m[1]) : "";
        name = m?.[2] ? decodeURIComponent(m[2]) : "";
    }
    catch { /* a malformed escape: the list instead */ }
    closeView = ns && name ? rolloutView(view, ns, name) : homeView();
    document.title = ns && name ? `${ns}/${name} · fleetroll` : "Rollouts · fleetroll";
    // Tell assistive technology the view changed: the focus goes to its heading.
    view.querySelector("h1")?.focus({ preventScroll: true });
}
function start() {
    if (!initToken()) {
        problem("This page needs the address `kubectl fleetroll dashboard` printed (it ends in #token=…). Open that one.");
        return;
    }
    getJSON("/api/me").then((me) => {
        const user = me.user ?? "";
        byId("user").textContent = user || "(unknown user)";
        setUser(user);
    }, (e) => {
        byId("user").textContent = "";
        if (e instanceof ApiError && e.status === 401)
            problem(e.message);
    });
    window.addEventListener("hashchange", route);
    route();
}
start();
