// nvcf-server console: a read-only view over the public API (docs/console.md).
//
// The API key lives in this tab's sessionStorage only and leaves it only as the Authorization
// header of fetch() calls to this origin's API. Views are addressed by the URL fragment
// (#/functions, #/deployments/<id>, ...), which carries ids, never the key.
//
// No HTML is ever parsed from strings: every node is built with createElement and text. The
// page's Content-Security-Policy enforces Trusted Types with no policy, so an innerHTML
// assignment here would throw instead of rendering.

const API = document.querySelector('meta[name="nvcf-api"]').content;
const KEY_ITEM = "nvcf-console-key";
const REFRESH_MS = 2000;
const SVG_NS = "http://www.w3.org/2000/svg";
const PHASES = ["Scheduling", "Starting", "Running", "Degraded", "Failed"];

// --- the key ------------------------------------------------------------------------------

const keyStore = {
  get: () => sessionStorage.getItem(KEY_ITEM),
  set: (key) => sessionStorage.setItem(KEY_ITEM, key),
  clear: () => sessionStorage.removeItem(KEY_ITEM),
};

class ApiError extends Error {
  constructor(status, problem) {
    const detail = problem && (problem.detail || problem.title);
    super(detail ? `${status}: ${detail}` : `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

async function api(path) {
  const key = keyStore.get();
  if (!key) throw new ApiError(401, { title: "no API key" });
  const resp = await fetch(API + path, {
    headers: { Authorization: `Bearer ${key}`, Accept: "application/json" },
    credentials: "omit",
    cache: "no-store",
    referrerPolicy: "no-referrer",
    redirect: "error",
  });
  let body = null;
  try {
    body = await resp.json();
  } catch {
    body = null;
  }
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body;
}

// The answer, or null (with the error) when the key may not read it or it does not exist.
async function optional(promise) {
  try {
    return { value: await promise, error: null };
  } catch (err) {
    if (err instanceof ApiError && [403, 404].includes(err.status)) {
      return { value: null, error: err };
    }
    throw err;
  }
}

const enc = encodeURIComponent;

// --- DOM helpers ----------------------------------------------------------------------------

function add(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    el.setAttribute(name, value === true ? "" : String(value));
  }
  return add(el, children);
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) el.setAttribute(name, String(value));
  }
  return add(el, children);
}

// A class-name-safe word of an API value (a status, a phase, a severity).
const word = (value) => String(value || "unknown").replace(/[^A-Za-z0-9_-]/g, "");

function badge(kind, value) {
  return h("span", { class: `badge ${kind}-${word(value)}`, "data-value": value }, value);
}

function table(id, caption, headers, rows) {
  return h(
    "table",
    { id },
    h("caption", null, caption),
    h("thead", null, h("tr", null, headers.map((name) => h("th", { scope: "col" }, name)))),
    h("tbody", null, rows),
  );
}

function details(pairs) {
  return h(
    "dl",
    { class: "details" },
    pairs
      .filter(([, value]) => value !== null && value !== undefined && value !== "")
      .map(([name, value]) => [h("dt", null, name), h("dd", null, value)]),
  );
}

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const link = (href, text, attrs) => h("a", { href, ...attrs }, text);
const short = (id) => (id ? String(id).slice(0, 8) : "");
const versionHref = (fid, vid) => `#/functions/${enc(fid)}/versions/${enc(vid)}`;
const deploymentHref = (did) => `#/deployments/${enc(did)}`;

function utc(iso, withDate = true) {
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return String(iso || "");
  const text = t.toISOString();
  return withDate ? `${text.slice(0, 10)} ${text.slice(11, 19)}Z` : `${text.slice(11, 23)}Z`;
}

// "+1.5s", "+42s", "+3m05s", "+2h10m": how long after the chart's start
function offset(ms) {
  const s = ms / 1000;
  if (s < 10) return `+${s.toFixed(1)}s`;
  if (s < 120) return `+${Math.round(s)}s`;
  const m = Math.floor(s / 60);
  if (m < 120) return `+${m}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `+${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
}

function when(iso) {
  return h("time", { datetime: iso, title: iso }, utc(iso));
}

// --- views --------------------------------------------------------------------------------

async function functionsView() {
  const [list, deployments] = await Promise.all([
    api("/functions"),
    optional(api("/deployments")),
  ]);
  const byVersion = new Map(
    (deployments.value ? deployments.value.deployments : []).map((d) => [d.functionVersionId, d]),
  );
  const groups = new Map();
  for (const v of list.functions) {
    if (!groups.has(v.id)) groups.set(v.id, []);
    groups.get(v.id).push(v);
  }
  const rows = [];
  for (const [fid, versions] of groups) {
    versions.forEach((v, i) => {
      const dep = byVersion.get(v.versionId);
      rows.push(
        h(
          "tr",
          { "data-function-id": fid, "data-version-id": v.versionId },
          i === 0
            ? h("td", { rowspan: versions.length }, h("strong", null, v.name), h("br"),
                h("code", { title: fid }, short(fid)))
            : null,
          h("td", null, link(versionHref(fid, v.versionId), short(v.versionId),
            { title: v.versionId, class: "mono" })),
          h("td", null, badge("status", v.status)),
          h("td", { class: "mono" }, v.helmChart ? `chart ${v.helmChart}` : v.containerImage || ""),
          h("td", null, dep ? link(deploymentHref(dep.deploymentId), "deployment") : "—"),
          h("td", null, when(v.createdAt)),
        ),
      );
    });
  }
  return h(
    "div",
    null,
    h("h1", null, "Functions"),
    rows.length
      ? table("functions", `${plural(groups.size, "function")}, ${plural(list.functions.length, "version")}`,
          ["Function", "Version", "Status", "Runs", "Deployment", "Created"], rows)
      : h("p", { class: "muted" }, "No functions yet."),
    deployments.error
      ? h("p", { class: "muted" }, `Deployments are not shown: ${deployments.error.message}`)
      : null,
  );
}

function phaseCounts(instances) {
  const counts = new Map();
  for (const i of instances || []) counts.set(i.phase, (counts.get(i.phase) || 0) + 1);
  return [...counts].map(([phase, n]) => h("span", { class: "count" }, badge("phase", phase), ` ×${n}`));
}

async function deploymentsView() {
  const { deployments } = await api("/deployments");
  const rows = deployments.map((d) =>
    h(
      "tr",
      { "data-deployment-id": d.deploymentId },
      h("td", null, link(deploymentHref(d.deploymentId), short(d.deploymentId),
        { title: d.deploymentId, class: "mono" })),
      h("td", null, d.functionName, " ",
        link(versionHref(d.functionId, d.functionVersionId), short(d.functionVersionId),
          { title: d.functionVersionId, class: "mono" })),
      h("td", null, badge("status", d.functionStatus)),
      h("td", null, phaseCounts(d.instances)),
      h("td", null, when(d.lastUpdatedAt)),
    ),
  );
  return h(
    "div",
    null,
    h("h1", null, "Deployments"),
    rows.length
      ? table("deployments", plural(rows.length, "deployment"),
          ["Deployment", "Function version", "Status", "Instances", "Updated"], rows)
      : h("p", { class: "muted" }, "No deployments yet."),
  );
}

function findingsSection(v) {
  if (!v.helmChart) {
    return h("p", { id: "findings", class: "muted" },
      "A container function: no chart, so no chart findings.");
  }
  const findings = v.findings || [];
  if (!findings.length) {
    return h("p", { id: "findings", class: "muted" }, "The chart passed every rule: no findings.");
  }
  const order = { error: 0, warning: 1, info: 2 };
  const sorted = [...findings].sort((a, b) => (order[a.severity] ?? 3) - (order[b.severity] ?? 3));
  return table(
    "findings",
    `${plural(findings.length, "finding")} of the chart at its creation`,
    ["Severity", "Rule", "Object", "Field", "Message"],
    sorted.map((f) =>
      h(
        "tr",
        { "data-rule": f.rule },
        h("td", null, badge("severity", f.severity)),
        h("td", { class: "mono" }, f.rule),
        h("td", { class: "mono" }, f.object || ""),
        h("td", { class: "mono" }, f.field || ""),
        h("td", null, f.message),
      ),
    ),
  );
}

async function versionView(fid, vid) {
  const base = `/functions/${enc(fid)}/versions/${enc(vid)}`;
  const [{ function: v }, dep] = await Promise.all([
    api(base),
    optional(api(`/deployments${base}`)),
  ]);
  const deployment = dep.value ? dep.value.deployment : null;
  return h(
    "div",
    null,
    h("p", { class: "crumbs" }, link("#/functions", "Functions"), " / ", v.name),
    h("h1", null, `${v.name} `, h("span", { id: "status" }, badge("status", v.status))),
    details([
      ["Function", h("code", null, v.id)],
      ["Version", h("code", null, v.versionId)],
      ["Account", v.ncaId],
      ["Container image", v.containerImage && h("code", null, v.containerImage)],
      ["Helm chart", v.helmChart && h("code", null, v.helmChart)],
      ["Chart digest", v.helmChartDigest && h("code", null, v.helmChartDigest)],
      ["Service", v.helmChartServiceName],
      ["Inference", `${v.inferenceUrl || ""}${v.inferencePort ? ` on port ${v.inferencePort}` : ""}`],
      ["Type", `${v.functionType} (${v.apiBodyFormat})`],
      ["Description", v.description],
      ["Tags", (v.tags || []).join(", ")],
      ["Created", when(v.createdAt)],
      [
        "Deployment",
        deployment
          ? h("span", { id: "deployment-link" },
              link(deploymentHref(deployment.deploymentId), short(deployment.deploymentId),
                { class: "mono", title: deployment.deploymentId }),
              " ", badge("status", deployment.functionStatus))
          : dep.error && dep.error.status === 403
            ? `not shown: ${dep.error.message}`
            : "not deployed",
      ],
    ]),
    h("h2", null, "Chart findings"),
    findingsSection(v),
  );
}

// --- the deployment timeline chart ------------------------------------------------------------

// One row per instance: a bar per phase, from the event that entered it to the next phase
// change, the instance's last event (gone) or now (still there); dots mark its other events.
function timelineChart(deployment, events, now) {
  const rows = new Map();
  for (const e of events) {
    if (!e.instanceId) continue;
    if (!rows.has(e.instanceId)) rows.set(e.instanceId, { events: [] });
    rows.get(e.instanceId).events.push({ ...e, t: Date.parse(e.at) });
  }
  if (!rows.size) {
    return h("p", { id: "timeline", class: "muted" }, "No instance has been created yet.");
  }
  const present = new Map((deployment.instances || []).map((i) => [i.instanceId, i]));
  const times = events.map((e) => Date.parse(e.at));
  const start = times.reduce((a, b) => Math.min(a, b));
  let end = times.reduce((a, b) => Math.max(a, b));
  const live = [...present.values()].some((i) => i.phase !== "Failed");
  if (live) end = Math.max(end, now);
  end = Math.max(end, start + 1000);

  const width = 960;
  const left = 170;
  const right = 12;
  const top = 26;
  const rowHeight = 26;
  const bar = 16;
  const height = top + (rows.size + 1) * rowHeight + 6;
  const x = (t) => left + ((t - start) / (end - start)) * (width - left - right);

  const chart = svg("svg", {
    id: "timeline",
    class: "timeline",
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `phases of ${plural(rows.size, "instance")} over time`,
  });
  // time axis: the start in UTC, then offsets from it
  const ticks = 6;
  for (let i = 0; i <= ticks; i++) {
    const t = start + ((end - start) * i) / ticks;
    const tx = x(t);
    const anchor = i === 0 ? "start" : i === ticks ? "end" : "middle";
    add(chart,
      svg("line", { class: "grid", x1: tx, x2: tx, y1: top - 6, y2: height }),
      svg("text", { class: "tick", x: tx, y: 12, "text-anchor": anchor },
        i === 0 ? utc(new Date(t).toISOString(), false) : offset(t - start)));
  }
  // the version's status, from the status events ("function version status A → B ...")
  const statusEvents = events.filter((e) => e.kind === "status");
  const statusY = top;
  add(chart, svg("text", { class: "label", x: 0, y: statusY + bar - 3 }, "version status"));
  statusEvents.forEach((e, i) => {
    const to = /→ ([A-Z_]+)/.exec(e.message);
    if (!to) return;
    const from = Date.parse(e.at);
    const until = i + 1 < statusEvents.length ? Date.parse(statusEvents[i + 1].at) : end;
    add(chart, svg("rect", {
      class: `seg status-${word(to[1])}`, "data-status": to[1],
      x: x(from), y: statusY, width: Math.max(x(until) - x(from), 3), height: bar, rx: 2,
    }, svg("title", null, `${utc(e.at, false)} ${e.message}`)));
  });
  let index = 0;
  for (const [instanceId, row] of rows) {
    index += 1;
    const y = top + index * rowHeight;
    const current = present.get(instanceId);
    const placed = row.events.find((e) => e.reason === "Placed");
    const cluster = current?.cluster || (placed ? placed.message.split(" ").pop() : "");
    const g = svg("g", { class: "instance-row", "data-instance-id": instanceId });
    add(g, svg("text", { class: "label", x: 0, y: y + bar - 3 },
      svg("title", null, instanceId), `${short(instanceId)} ${cluster || ""}`));
    const changes = row.events.filter((e) => e.kind === "instance");
    const last = row.events[row.events.length - 1].t;
    const rowEnd = current && current.phase !== "Failed" ? end : last;
    changes.forEach((e, i) => {
      const from = e.t;
      const next = changes.slice(i + 1).find((c) => c.phase !== e.phase);
      if (i > 0 && changes[i - 1].phase === e.phase) return; // same phase: one bar
      const to = next ? next.t : rowEnd;
      const x1 = x(from);
      const w = Math.max(x(to) - x1, 3);
      add(g, svg("rect", {
        class: `seg phase-${word(e.phase)}`,
        "data-phase": e.phase,
        x: x1, y, width: w, height: bar, rx: 2,
      }, svg("title", null,
        `${e.phase}${e.reason ? ` (${e.reason})` : ""}: ${utc(e.at, false)} → ` +
        `${next ? utc(next.at, false) : to === end && live ? "now" : utc(new Date(to).toISOString(), false)}\n${e.message}`)));
    });
    for (const e of row.events.filter((ev) => ev.kind !== "instance")) {
      add(g, svg("circle", { class: `mark kind-${word(e.kind)}`, cx: x(e.t), cy: y + bar / 2, r: 3.5 },
        svg("title", null, `${utc(e.at, false)} ${e.kind}${e.reason ? ` (${e.reason})` : ""}\n${e.message}`)));
    }
    add(chart, g);
  }
  const legend = h("p", { class: "legend" },
    PHASES.map((p) => h("span", null, badge("phase", p))),
    h("span", { class: "muted" }, " dots: observations and retirements; hover for details"));
  return h("figure", null, chart, h("figcaption", null, legend));
}

async function deploymentView(did) {
  const base = `/deployments/${enc(did)}`;
  const [{ deployment: d }, { events }] = await Promise.all([api(base), api(`${base}/events`)]);
  const health = d.healthInfo || [];
  return h(
    "div",
    null,
    h("p", { class: "crumbs" }, link("#/deployments", "Deployments"), " / ", short(d.deploymentId)),
    h("h1", null, `${d.functionName} `, h("span", { id: "status" }, badge("status", d.functionStatus))),
    details([
      ["Deployment", h("code", null, d.deploymentId)],
      ["Function version", link(versionHref(d.functionId, d.functionVersionId), d.functionVersionId,
        { class: "mono", id: "version-link" })],
      ["Created", when(d.createdAt)],
      ["Updated", when(d.lastUpdatedAt)],
    ]),
    health.length
      ? h("div", { id: "health", class: "problems", role: "alert" },
          h("h2", null, "Health"),
          h("ul", null, health.map((hi) => h("li", null,
            h("strong", null, `${hi.gpu} ${hi.instanceType} (${hi.backend}): `), hi.error))))
      : null,
    h("h2", null, "GPU specifications"),
    table("specifications", plural(d.deploymentSpecifications.length, "specification"),
      ["GPU", "Instance type", "Backend", "Instances", "Clusters"],
      d.deploymentSpecifications.map((s) => h("tr", null,
        h("td", null, s.gpu), h("td", { class: "mono" }, s.instanceType), h("td", null, s.backend),
        h("td", null, `${s.minInstances}–${s.maxInstances}`),
        h("td", null, (s.clusters || []).join(", ") || "any")))),
    h("h2", null, "Instances"),
    d.instances.length
      ? table("instances", plural(d.instances.length, "instance"),
          ["Instance", "Cluster", "Phase", "Reason", "Message", "Since"],
          d.instances.map((i) => h("tr", { "data-instance-id": i.instanceId },
            h("td", { class: "mono", title: i.instanceId }, short(i.instanceId)),
            h("td", null, i.cluster || "—"),
            h("td", null, badge("phase", i.phase)),
            h("td", { class: "reason" }, i.reason || ""),
            h("td", null, i.message || ""),
            h("td", null, when(i.since)))))
      : h("p", { id: "instances", class: "muted" }, "No instances."),
    h("h2", null, "Phases over time"),
    timelineChart(d, events, Date.now()),
    h("h2", null, "Event timeline"),
    table("events", plural(events.length, "event"),
      ["At (UTC)", "Kind", "Instance", "Phase", "Reason", "Message"],
      events.map((e) => h("tr", { class: `kind-${word(e.kind)}` },
        h("td", { class: "mono" }, h("time", { datetime: e.at, title: e.at }, utc(e.at, false))),
        h("td", null, e.kind),
        h("td", { class: "mono", title: e.instanceId || "" }, short(e.instanceId)),
        h("td", null, e.phase ? badge("phase", e.phase) : ""),
        h("td", { class: "reason" }, e.reason || ""),
        h("td", null, e.message)))),
  );
}

// --- routing and refresh ----------------------------------------------------------------------

const ROUTES = [
  [/^#\/functions\/([^/]+)\/versions\/([^/]+)$/, versionView],
  [/^#\/deployments\/([^/]+)$/, deploymentView],
  [/^#\/deployments$/, deploymentsView],
  [/^#\/functions$/, functionsView],
];

const $ = (id) => document.getElementById(id);
let generation = 0;
let timer = null;

function showLogin(message) {
  clearTimeout(timer);
  generation += 1;
  $("view").replaceChildren();
  $("nav").hidden = true;
  $("forget").hidden = true;
  $("refreshed").textContent = "";
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("key-input").focus();
}

function route() {
  for (const [pattern, view] of ROUTES) {
    const match = pattern.exec(location.hash);
    if (match) return () => view(...match.slice(1).map(decodeURIComponent));
  }
  return null;
}

async function load(gen) {
  const view = route();
  if (!view) {
    history.replaceState(null, "", "#/functions");
    start();
    return;
  }
  try {
    const node = await view();
    if (gen !== generation) return;
    $("view").replaceChildren(node);
    $("refreshed").textContent = `updated ${utc(new Date().toISOString(), false).slice(0, 8)}Z`;
    document.body.dataset.loaded = location.hash;
  } catch (err) {
    if (gen !== generation) return;
    if (err instanceof ApiError && err.status === 401) {
      keyStore.clear();
      showLogin(`The key was refused (${err.message}). Paste another one.`);
      return;
    }
    $("view").replaceChildren(h("p", { class: "error", role: "alert" }, String(err.message || err)));
    document.body.dataset.loaded = location.hash;
  }
  if (gen === generation) {
    // refreshed while the tab is shown; a hidden tab asks the API nothing
    timer = setTimeout(function tick() {
      if (gen !== generation) return;
      if (document.hidden) timer = setTimeout(tick, REFRESH_MS);
      else load(gen);
    }, REFRESH_MS);
  }
}

function start() {
  clearTimeout(timer);
  generation += 1;
  if (!keyStore.get()) {
    showLogin();
    return;
  }
  $("login").hidden = true;
  $("nav").hidden = false;
  $("forget").hidden = false;
  delete document.body.dataset.loaded;
  load(generation);
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("key-input");
  const key = input.value.trim().replace(/^Bearer\s+/i, "");
  input.value = "";
  if (!key) return;
  keyStore.set(key);
  start();
});

$("forget").addEventListener("click", () => {
  keyStore.clear();
  showLogin("The key is forgotten.");
});

window.addEventListener("hashchange", start);
start();
