// nvcf-server console: a small page over the public API that shows and operates functions
// (docs/console.md).
//
// The API key lives in this tab's sessionStorage only and leaves it only as the Authorization
// header of fetch() calls to this origin's API. Views are addressed by the URL fragment
// (#/functions, #/deployments/<id>, ...), which carries ids, never the key.
//
// No HTML is ever parsed from strings: every node is built with createElement and text. The
// page's Content-Security-Policy enforces Trusted Types with no policy, so an innerHTML
// assignment here would throw instead of rendering.

// js-yaml, vendored from the npm registry (static/vendor/, docs/console.md "Vendored code");
// the query names its version so that the browser's week-long cache never serves an old one.
import { load as loadYaml } from "./js-yaml.esm.min.mjs?v=5.5.0";

const API = document.querySelector('meta[name="nvcf-api"]').content;
// NVCT's routes (cloud tasks) beside NVCF's, under the same root
const NVCT = API.replace(/\/v2\/nvcf$/, "/v1/nvct");
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

async function api(path, base = API) {
  const key = keyStore.get();
  if (!key) throw new ApiError(401, { title: "no API key" });
  const resp = await fetch(base + path, {
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

// A version's models; an LLM function's as the OpenAI `model` its callers give, with the
// paths each serves (docs/llm.md).
function modelsList(v) {
  const models = v.models || [];
  if (!models.length) return null;
  return h(
    "ul",
    { id: "models", class: "plain" },
    models.map((m) => {
      const c = m.llmConfig;
      if (v.functionType !== "LLM" || !c) {
        return h("li", null, h("code", null, `${m.name}${m.version ? `:${m.version}` : ""}`));
      }
      const extra = [c.routingMethod, c.tokenRateLimit && `${c.tokenRateLimit} tokens`]
        .filter(Boolean)
        .join(", ");
      return h(
        "li",
        null,
        h("code", null, `${v.id}/${m.name}`),
        ` ${(c.uris || []).join(" ")}${extra ? ` (${extra})` : ""}`,
      );
    }),
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
    h("p", { class: "actions" }, link("#/new", "New function", { id: "new-function", class: "button" })),
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
      ["Models", modelsList(v)],
      ["Telemetries", v.telemetries && h("span", { id: "version-telemetries" },
        TELEMETRY_FIELDS.filter(([id]) => v.telemetries[id])
          .map(([id, type]) => `${type} → ${v.telemetries[id]}`).join("; "))],
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
    versionActions(v, await caps()),
    h("h2", null, "Traffic"),
    await trafficSection(fid, await caps()),
    h("h2", null, "Last hour"),
    await versionCharts(fid, vid),
    h("h2", null, "Chart findings"),
    findingsSection(v),
  );
}

// --- a function's traffic split and its canary release (docs/rollouts.md) -----------------------

// [action, label, the phases that allow it]
const CANARY_ACTIONS = [
  ["pause", "Pause", ["RUNNING"]],
  ["resume", "Resume", ["PAUSED"]],
  ["promote", "Promote now", ["RUNNING", "PAUSED"]],
  ["abort", "Abort", ["RUNNING", "PAUSED"]],
];

function figuresText(f) {
  if (!f) return "–";
  const rate = (100 * (f.errorRate || 0)).toFixed(2);
  return `${f.requests} requests, ${f.errors} errors (${rate} %), p95 ${(f.p95Seconds || 0).toFixed(3)} s`;
}

const versionLink = (fid, vid) => link(versionHref(fid, vid), short(vid), { class: "mono", title: vid });

async function trafficSection(fid, can) {
  const base = `/functions/${enc(fid)}`;
  const split = await optional(api(`${base}/traffic`));
  const out = h("section", { id: "traffic" });
  const entries = split.value ? split.value.traffic : [];
  // a release always leaves a split: without one there is none to ask for (no 404 to log)
  const release = entries.length ? await optional(api(`${base}/canary`)) : {};
  add(out, entries.length
    ? table("traffic-split", "The function's traffic split", ["Version", "Weight"],
        entries.map((e) => h("tr", null, h("td", null, versionLink(fid, e.versionId)),
          h("td", null, `${e.weight} %`))))
    : h("p", { id: "traffic-split" }, "No split: the newest invocable version takes every invocation."));
  const r = release.value;
  if (!r) return out;
  const why = can.deploy ? null : NO_DEPLOY;
  const figures = r.analysis || {};
  const allowed = CANARY_ACTIONS.filter(([, , phases]) => phases.includes(r.phase));
  return add(out,
    h("h3", null, "Canary release ", h("span", { id: "canary-phase" }, badge("status", r.phase))),
    details([
      ["Step", h("span", { id: "canary-step" }, `${r.step} of ${r.steps}`)],
      ["Canary", h("span", { id: "canary-weight" }, versionLink(fid, r.canaryVersionId), ` at ${r.weight} %`)],
      ["Stable", h("span", null, versionLink(fid, r.stableVersionId), ` at ${100 - r.weight} %`)],
      ["Canary's figures", h("span", { id: "canary-figures" }, figuresText(figures.canary))],
      ["Stable's figures", h("span", { id: "stable-figures" }, figuresText(figures.stable))],
      ["Last change", h("span", { id: "canary-reason" }, r.reason || "–")],
    ]),
    allowed.length
      ? h("p", { class: "actions", id: "canary-actions" }, allowed.map(([action, label]) => [
          dangerButton(`canary-${action}`, label,
            `${label}: the canary release of version ${short(r.canaryVersionId)}?`, async () => {
              await send("POST", `${base}/canary/${action}`, {});
              start();
            }, why),
          " ",
        ]))
      : null,
  );
}

// --- per-version charts of the last hour (GET .../versions/{id}/metrics) -----------------------

// A small SVG chart of one or more series over the points' times; null values are gaps.
function seriesChart(id, title, points, series, unit) {
  const W = 320;
  const H = 90;
  const PAD = 24;
  const values = points.flatMap((p) => series.map(([key]) => p[key])).filter((v) => v !== null);
  const max = Math.max(1e-9, ...values, 0);
  const n = points.length;
  const x = (i) => PAD + (n <= 1 ? 0 : (i * (W - 2 * PAD)) / (n - 1));
  const y = (v) => H - PAD / 2 - (v / max) * (H - PAD);
  const lines = series.map(([key, label, cls]) => {
    let d = "";
    points.forEach((p, i) => {
      if (p[key] === null || p[key] === undefined) return;
      d += `${d && points[i - 1] && points[i - 1][key] !== null ? "L" : "M"}${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`;
    });
    const dots = points.map((p, i) => (p[key] === null || p[key] === undefined ? null
      : svg("circle", { cx: x(i).toFixed(1), cy: y(p[key]).toFixed(1), r: 1.5, class: `dot ${cls}` })));
    return [svg("path", { d: d || "M0,0", class: `series ${cls}`, "data-series": key },
      svg("title", null, label)), dots];
  });
  const last = n ? points[n - 1] : {};
  const legend = series.map(([key, label]) =>
    `${label}: ${last[key] === null || last[key] === undefined ? "—" : `${last[key]}${unit}`}`).join(" · ");
  return h("figure", { class: "chart", id, "data-points": n },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": `${title}: ${legend}` },
      svg("line", { x1: PAD, y1: H - PAD / 2, x2: W - PAD, y2: H - PAD / 2, class: "axis" }),
      svg("text", { x: 2, y: 10, class: "tick" }, max < 1e-6 ? "0" : String(Number(max.toPrecision(3)))),
      lines),
    h("figcaption", null, h("strong", null, title), " ", legend));
}

async function versionCharts(fid, vid) {
  const found = await optional(api(`/functions/${enc(fid)}/versions/${enc(vid)}/metrics`));
  const points = found.value ? found.value.points : [];
  if (!points.length) {
    return h("p", { id: "charts", class: "muted" }, "No samples yet (this server samples every "
      + `${found.value ? found.value.periodSeconds : "?"} s).`);
  }
  return h("div", { id: "charts", class: "charts" },
    seriesChart("chart-requests", "Requests", points,
      [["requests", "requests", "a"], ["errors", "errors", "bad"]], ""),
    seriesChart("chart-latency", "Latency", points,
      [["latencyP50", "p50", "a"], ["latencyP99", "p99", "b"]], " s"),
    seriesChart("chart-queue", "Queue depth", points, [["queueDepth", "waiting", "a"]], ""),
    seriesChart("chart-instances", "Instances", points,
      [["running", "Running", "a"], ["target", "autoscaler target", "b"]], ""));
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
    d.removedAt ? null : deploymentActions(d, await caps()),
    health.length
      ? h("div", { id: "health", class: "problems", role: "alert" },
          h("h2", null, "Health"),
          h("ul", null, health.map((hi) => h("li", null,
            h("strong", null, `${hi.gpu} ${hi.instanceType} (${hi.backend}): `), hi.error,
            hi.lastLogs && hi.lastLogs.length
              ? h("pre", { class: "log last-lines" }, hi.lastLogs.join("\n"))
              : null))))
      : null,
    h("h2", null, "GPU specifications"),
    table("specifications", plural(d.deploymentSpecifications.length, "specification"),
      ["GPU", "Instance type", "Backend", "Instances", "Clusters", "Revision"],
      d.deploymentSpecifications.map((s) => h("tr", null,
        h("td", null, s.gpu), h("td", { class: "mono" }, s.instanceType), h("td", null, s.backend),
        h("td", null, `${s.minInstances}–${s.maxInstances}`),
        h("td", null, (s.clusters || []).join(", ") || "any"),
        h("td", { class: "rollout" }, rolloutText(s))))),
    d.removedAt ? null : h("h2", null, "Revisions"),
    d.removedAt ? null : await revisionsSection(d, await caps()),
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

// --- operating: forms, actions, the playground and the logs -----------------------------------
//
// Every action is one call of the public API a user could make with curl, under the key's own
// scopes. Forms live in views that are not refreshed (what is typed stays); a refused call
// shows the API's problem+json: its detail, and each violation next to its field.

async function send(method, path, body, base = API) {
  const key = keyStore.get();
  if (!key) throw new ApiError(401, { title: "no API key" });
  const headers = { Authorization: `Bearer ${key}`, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(base + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
    referrerPolicy: "no-referrer",
    redirect: "error",
  });
  let parsed = null;
  try {
    parsed = await resp.json();
  } catch {
    parsed = null;
  }
  if (!resp.ok) throw new ApiError(resp.status, parsed);
  return parsed;
}

// What the key may do, asked once per start: deploying (and reading deployments) needs
// `deploy_function`, which a read of the deployments list tells without changing anything.
let capabilities = null;
async function caps() {
  if (capabilities === null) {
    const probe = await optional(api("/deployments?limit=1"));
    capabilities = { deploy: !(probe.error && probe.error.status === 403) };
  }
  return capabilities;
}

// A labelled input; `field` is the API's name of it (problem+json errors name it).
function field(label, id, attrs, hint) {
  const input = h(attrs.tag || "input", { id, name: id, "data-field": attrs.field || id,
    "aria-describedby": `${id}-error`, ...attrs, tag: null, field: null });
  if (attrs.tag === "textarea" && attrs.value) input.value = attrs.value;
  return h("div", { class: "field" },
    h("label", { for: id }, label),
    input,
    hint ? h("small", { class: "muted" }, hint) : null,
    h("span", { id: `${id}-error`, class: "field-error error", role: "alert" }));
}

function clearErrors(form) {
  for (const e of form.querySelectorAll(".field-error, .form-error")) e.textContent = "";
  for (const e of form.querySelectorAll("[aria-invalid]")) e.removeAttribute("aria-invalid");
}

// Each violation next to its field (`deploymentSpecifications[0].minInstances` is the field
// `minInstances`), the others and the detail in the form's alert.
function showErrors(form, err) {
  const problem = err.problem || {};
  const rest = [];
  for (const e of problem.errors || []) {
    const name = String(e.field || "").replace(/^.*\]\./, "").replace(/^.*\./, "");
    const input = form.querySelector(`[data-field="${CSS.escape(name)}"]`);
    if (input) {
      input.setAttribute("aria-invalid", "true");
      const slot = form.querySelector(`#${CSS.escape(input.id)}-error`);
      slot.textContent = slot.textContent ? `${slot.textContent}; ${e.message}` : e.message;
    } else {
      rest.push(`${e.field}: ${e.message}`);
    }
  }
  form.querySelector(".form-error").textContent = [err.message, ...rest].join(" — ");
}

function formOf(id, submitLabel, fields, onSubmit, disabledWhy) {
  const form = h("form", { id, novalidate: true },
    fields,
    h("button", { type: "submit", id: `${id}-submit`, disabled: Boolean(disabledWhy) }, submitLabel),
    disabledWhy ? h("p", { class: "muted", id: `${id}-disabled` }, disabledWhy) : null,
    h("p", { class: "form-error error", role: "alert" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      await onSubmit(form);
    } catch (err) {
      if (err instanceof ApiError) showErrors(form, err);
      else form.querySelector(".form-error").textContent = String(err.message || err);
    } finally {
      button.disabled = Boolean(disabledWhy);
    }
  });
  return form;
}

const value = (form, id) => form.querySelector(`#${id}`).value.trim();
const NO_DEPLOY = "This key lacks the deploy_function scope: deploying, scaling, undeploying "
  + "and logs are not available.";

// The function form's telemetry choices: for each type (TelemetriesDto's field), a select of the
// account's endpoints that receive it; a key without manage_telemetries gets a note instead.
function telemetryFields(listed) {
  if (listed.error) {
    return h("p", { class: "muted", id: "telemetries-unavailable" },
      `Telemetries are not offered: ${listed.error.message}`);
  }
  const all = listed.value.telemetries;
  return h("fieldset", { id: "telemetries-fields" },
    h("legend", null, "Telemetry endpoints (optional)"),
    TELEMETRY_FIELDS.map(([id, type]) => {
      const choices = all.filter((t) => (t.types || []).includes(type));
      return field(type.charAt(0) + type.slice(1).toLowerCase(), id, { tag: "select" },
        choices.length ? null : `no endpoint of the account receives ${type}`);
    }),
    link("#/telemetries", "Manage telemetry endpoints"));
}

function fillTelemetryChoices(form, listed) {
  if (listed.error) return;
  for (const [id, type] of TELEMETRY_FIELDS) {
    const select = form.querySelector(`#${id}`);
    add(select, h("option", { value: "" }, "none"));
    for (const t of listed.value.telemetries.filter((x) => (x.types || []).includes(type))) {
      add(select, h("option", { value: t.telemetryId }, `${t.name} (${t.provider})`));
    }
  }
}

async function newFunctionView() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const of = params.get("function") || "";
  const listed = await optional(api("/telemetries"));
  const form = newFunctionForm(of, listed);
  fillTelemetryChoices(form, listed);
  return h("div", null,
    h("p", { class: "crumbs" }, link("#/functions", "Functions"), " / new"),
    h("h1", null, of ? "New version" : "New function"),
    form);
}

function newFunctionForm(of, listed) {
  return formOf("create-form", of ? "Create the version" : "Create the function", [
      field("Name", "name", { required: true, maxlength: 128 }),
      field("Container image", "containerImage", { placeholder: "nvcr.io/org/image:tag" },
        "a container function: its image"),
      field("Helm chart", "helmChart", { placeholder: "https://… or oci://…" },
        "or a Helm function: its chart (then the service below)"),
      field("Chart service", "helmChartServiceName", { placeholder: "entrypoint" }),
      field("Inference URL", "inferenceUrl", { required: true, value: "/echo" }),
      field("Inference port", "inferencePort", { type: "number", value: "8000", min: 1, max: 65535 }),
      field("New version of function", "functionId", { value: of, placeholder: "(a new function)" }),
      telemetryFields(listed),
    ], async (form) => {
      const body = { name: value(form, "name"), inferenceUrl: value(form, "inferenceUrl") };
      for (const id of ["containerImage", "helmChart", "helmChartServiceName"]) {
        if (value(form, id)) body[id] = value(form, id);
      }
      const port = value(form, "inferencePort");
      if (port) body.inferencePort = Number(port);
      const telemetries = {};
      for (const [id] of listed.error ? [] : TELEMETRY_FIELDS) {
        if (value(form, id)) telemetries[id] = value(form, id);
      }
      if (Object.keys(telemetries).length) body.telemetries = telemetries;
      const fid = value(form, "functionId");
      const made = await send("POST", fid ? `/functions/${enc(fid)}/versions` : "/functions", body);
      location.hash = versionHref(made.function.id, made.function.versionId);
    });
}

// A configuration typed as YAML or JSON (YAML 1.2 reads JSON as it is): the mapping it
// holds, or an ApiError naming the field with the parser's line and column, so nothing is
// sent. Empty text: `empty`.
function parseConfiguration(text, empty) {
  if (!text.trim()) return empty;
  let parsed;
  try {
    parsed = loadYaml(text);
  } catch (err) {
    throw new ApiError(400, { detail: "the configuration is neither YAML nor JSON",
      errors: [{ field: "configuration", message: String(err.message) }] });
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new ApiError(400, { detail: "the configuration is not a mapping",
      errors: [{ field: "configuration",
        message: "must be a mapping of values (key: value), not a list or a single value" }] });
  }
  return parsed;
}

async function deployView(fid, vid) {
  const [{ function: v }, groups, can] = await Promise.all([
    api(`/functions/${enc(fid)}/versions/${enc(vid)}`),
    optional(api("/clusterGroups")),
    caps(),
  ]);
  const options = [];
  for (const g of groups.value ? groups.value.clusterGroups : []) {
    for (const gpu of g.gpus || []) {
      for (const it of gpu.instanceTypes || []) {
        options.push(h("option", { value: JSON.stringify([g.name, gpu.name, it.name]),
          selected: it.default && !options.length }, `${gpu.name} · ${it.name} (${g.name})`));
      }
    }
  }
  return h("div", null,
    h("p", { class: "crumbs" }, link("#/functions", "Functions"), " / ",
      link(versionHref(fid, vid), v.name), " / deploy"),
    h("h1", null, `Deploy ${v.name}`),
    formOf("deploy-form", "Deploy", [
      h("div", { class: "field" }, h("label", { for: "instanceType" }, "GPU and instance type"),
        h("select", { id: "instanceType", "data-field": "instanceType",
          "aria-describedby": "instanceType-error" }, options),
        h("span", { id: "instanceType-error", class: "field-error error", role: "alert" })),
      field("Minimum instances", "minInstances", { type: "number", value: "1", min: 0 }),
      field("Maximum instances", "maxInstances", { type: "number", value: "1", min: 1 }),
      field("Configuration (YAML or JSON)", "configuration", { tag: "textarea", rows: 6,
        placeholder: "replicaCount: 1" }, "Helm values of a Helm function; empty: none"),
    ], async (form) => {
      const [backend, gpu, instanceType] = JSON.parse(value(form, "instanceType") || "[]");
      const spec = { gpu, instanceType, backend,
        minInstances: Number(value(form, "minInstances")),
        maxInstances: Number(value(form, "maxInstances")) };
      const configuration = parseConfiguration(value(form, "configuration"), null);
      if (configuration !== null) spec.configuration = configuration;
      const made = await send("POST", `/deployments/functions/${enc(fid)}/versions/${enc(vid)}`,
        { deploymentSpecifications: [spec] });
      location.hash = deploymentHref(made.deployment.deploymentId);
    }, can.deploy ? null : NO_DEPLOY),
    v.helmChart ? dryRunSection(v) : null);
}

// A Helm function's dry run (POST /helm/validate) with the deploy form's target and
// configuration: every finding shown before deploying, nothing stored.
function dryRunSection(v) {
  const out = h("div", { id: "dry-run", "aria-live": "polite" });
  const button = h("button", { type: "button", id: "dry-run-button" }, "Check (dry run)");
  button.addEventListener("click", async () => {
    const form = document.getElementById("deploy-form");
    clearErrors(form);
    out.replaceChildren(h("p", { class: "muted" }, "checking…"));
    try {
      const [backend, gpu, instanceType] = JSON.parse(value(form, "instanceType") || "[]");
      const configuration = parseConfiguration(value(form, "configuration"), null);
      const body = { helmChart: v.helmChart, helmChartServiceName: v.helmChartServiceName,
        inferencePort: v.inferencePort, gpu, instanceType, backend };
      if (configuration !== null) body.configuration = configuration;
      const result = await send("POST", "/helm/validate", body);
      const findings = [
        ...result.errors.map((f) => ["error", f]),
        ...result.warnings.map((f) => ["warning", f]),
        ...result.info.map((f) => ["info", f]),
      ];
      out.replaceChildren(
        h("p", { id: "dry-run-verdict", class: result.valid ? "" : "error" },
          result.valid ? `valid: ${plural(result.objects.length, "object")}` : "NOT valid: nothing would be deployed"),
        findings.length
          ? table("dry-run-findings", plural(findings.length, "finding"),
              ["Severity", "Rule", "Object", "Field", "Message"],
              findings.map(([severity, f]) => h("tr", null,
                h("td", null, badge("severity", severity)), h("td", { class: "mono" }, f.rule || ""),
                h("td", { class: "mono" }, f.object || ""), h("td", { class: "mono" }, f.field || ""),
                h("td", null, f.message || ""))))
          : null);
    } catch (err) {
      out.replaceChildren();
      if (err instanceof ApiError) showErrors(form, err);
      else form.querySelector(".form-error").textContent = String(err.message || err);
    }
  });
  return h("section", null, h("h2", null, "Dry run"), button, out);
}

async function scaleView(did) {
  const [{ deployment: d }, can] = await Promise.all([api(`/deployments/${enc(did)}`), caps()]);
  const spec = d.deploymentSpecifications[0];
  return h("div", null,
    h("p", { class: "crumbs" }, link(deploymentHref(did), d.functionName), " / scale"),
    h("h1", null, `Scale ${d.functionName}`),
    formOf("scale-form", "Scale", [
      field("Minimum instances", "minInstances", { type: "number", value: spec.minInstances, min: 0 }),
      field("Maximum instances", "maxInstances", { type: "number", value: spec.maxInstances, min: 1 }),
    ], async (form) => {
      await send("PATCH", `/deployments/${enc(did)}/gpu-specifications/${enc(spec.gpuSpecificationId)}`,
        { minInstances: Number(value(form, "minInstances")),
          maxInstances: Number(value(form, "maxInstances")) });
      location.hash = deploymentHref(did);
    }, can.deploy ? null : NO_DEPLOY));
}

// A destructive action: asks first, then calls the API; a refusal is shown in `where`.
function dangerButton(id, label, question, action, disabledWhy) {
  const out = h("span", { class: "action" });
  const button = h("button", { type: "button", id, class: "danger", disabled: Boolean(disabledWhy),
    title: disabledWhy || null }, label);
  const error = h("span", { class: "error", role: "alert", id: `${id}-error` });
  button.addEventListener("click", async () => {
    if (!window.confirm(question)) return;
    button.disabled = true;
    try {
      await action();
    } catch (err) {
      error.textContent = String(err.message || err);
      button.disabled = false;
    }
  });
  return add(out, button, " ", error);
}

function versionActions(v, can) {
  const fid = v.id;
  const vid = v.versionId;
  return h("p", { class: "actions", id: "version-actions" },
    can.deploy
      ? link(`${versionHref(fid, vid)}/deploy`, "Deploy", { id: "deploy-link", class: "button" })
      : h("button", { type: "button", id: "deploy-link", disabled: true, title: NO_DEPLOY }, "Deploy"),
    " ", link(`${versionHref(fid, vid)}/invoke`, "Invoke", { id: "invoke-link", class: "button" }),
    " ", link(`#/new?function=${enc(fid)}`, "New version", { class: "button" }),
    " ", dangerButton("delete-version", "Delete version",
      `Delete version ${vid} of ${v.name}? Its deployment is torn down.`, async () => {
        await send("DELETE", `/functions/${enc(fid)}/versions/${enc(vid)}`);
        location.hash = "#/functions";
      }));
}

function deploymentActions(d, can) {
  const why = can.deploy ? null : NO_DEPLOY;
  const base = `/deployments/functions/${enc(d.functionId)}/versions/${enc(d.functionVersionId)}`;
  return h("p", { class: "actions", id: "deployment-actions" },
    can.deploy
      ? [link(`${deploymentHref(d.deploymentId)}/scale`, "Scale", { id: "scale-link", class: "button" }),
         " ", link(`${deploymentHref(d.deploymentId)}/configure`, "Configure",
           { id: "configure-link", class: "button" }),
         " ", link(`${deploymentHref(d.deploymentId)}/logs`, "Logs", { id: "logs-link", class: "button" })]
      : null,
    " ", link(`${versionHref(d.functionId, d.functionVersionId)}/invoke`, "Invoke",
      { id: "invoke-link", class: "button" }),
    " ", dangerButton("undeploy", "Undeploy", `Undeploy ${d.functionName}? Its instances are torn down.`,
      async () => {
        await send("DELETE", base);
        location.hash = versionHref(d.functionId, d.functionVersionId);
      }, why));
}

// Streams a fetch answer's text into `out` as it arrives; the fetch is aborted when the view
// changes (start() aborts `streaming`).
let streaming = null;
async function streamInto(resp, out) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { done, value: chunk } = await reader.read();
    if (done) break;
    out.append(decoder.decode(chunk, { stream: true }));
  }
}

function parseHeaders(text) {
  const headers = {};
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf(":");
    if (at <= 0) throw new Error(`header line '${line}': use 'Name: value'`);
    headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return headers;
}

async function invokeView(fid, vid) {
  const { function: v } = await api(`/functions/${enc(fid)}/versions/${enc(vid)}`);
  const answer = h("pre", { id: "answer", class: "log", "aria-live": "polite" });
  const meta = h("p", { id: "answer-meta", class: "muted" });
  const form = formOf("invoke-form", "Send", [
    field("Body", "body", { tag: "textarea", rows: 6, value: '{"hello": "world"}' }),
    field("Headers", "headers", { tag: "textarea", rows: 3, placeholder: "Name: value" },
      "one per line, e.g. Accept: text/event-stream"),
  ], async (f) => {
    answer.textContent = "";
    meta.textContent = "sending…";
    const headers = { ...parseHeaders(value(f, "headers")) };
    headers.Authorization = `Bearer ${keyStore.get()}`;
    if (!Object.keys(headers).some((k) => k.toLowerCase() === "content-type")) {
      headers["Content-Type"] = "application/json";
    }
    const started = performance.now();
    streaming = new AbortController();
    const resp = await fetch(`${API}/pexec/functions/${enc(fid)}/versions/${enc(vid)}`, {
      method: "POST", headers, body: f.querySelector("#body").value, credentials: "omit",
      cache: "no-store", referrerPolicy: "no-referrer", redirect: "error",
      signal: streaming.signal,
    });
    const id = resp.headers.get("nvcf-reqid") || "—";
    meta.textContent = `HTTP ${resp.status} · request ${id} · first byte after `
      + `${Math.round(performance.now() - started)} ms`;
    await streamInto(resp, answer);
    meta.textContent += ` · done after ${Math.round(performance.now() - started)} ms`;
  });
  return h("div", null,
    h("p", { class: "crumbs" }, link("#/functions", "Functions"), " / ",
      link(versionHref(fid, vid), v.name), " / invoke"),
    h("h1", null, `Invoke ${v.name}`),
    form, meta, answer);
}

async function logsView(did) {
  const [{ deployment: d }, can] = await Promise.all([api(`/deployments/${enc(did)}`), caps()]);
  const out = h("pre", { id: "log", class: "log", "aria-live": "off", tabindex: 0 });
  const state = h("p", { id: "log-state", class: "muted" });
  const view = h("div", null,
    h("p", { class: "crumbs" }, link(deploymentHref(did), d.functionName), " / logs"),
    h("h1", null, `Logs of ${d.functionName}`),
    can.deploy ? null : h("p", { class: "muted" }, NO_DEPLOY),
    state, out);
  if (!can.deploy) return view;
  followLog(`${API}/deployments/${enc(did)}/logs`, state, out,
    "the log ended (no Running instance, or it ended).");
  return view;
}

// A log route's last 200 lines, then its new ones as they come, into `out` (a deployment's
// instances, a task's containers); leaving the view aborts it.
function followLog(url, state, out, ended) {
  streaming = new AbortController();
  const signal = streaming.signal;
  fetch(`${url}?follow=true&tailLines=200`, {
    headers: { Authorization: `Bearer ${keyStore.get()}` }, credentials: "omit",
    cache: "no-store", referrerPolicy: "no-referrer", redirect: "error", signal,
  }).then(async (resp) => {
    if (!resp.ok) {
      state.textContent = `HTTP ${resp.status}`;
      return;
    }
    state.textContent = "following…";
    await streamInto(resp, out);
    state.textContent = ended;
  }).catch((err) => {
    if (!signal.aborted) state.textContent = String(err.message || err);
  });
}

async function configureView(did) {
  const [{ deployment: d }, can] = await Promise.all([api(`/deployments/${enc(did)}`), caps()]);
  const spec = d.deploymentSpecifications[0];
  const current = spec.configuration ? JSON.stringify(spec.configuration, null, 2) : "{}";
  return h("div", null,
    h("p", { class: "crumbs" }, link(deploymentHref(did), d.functionName), " / configuration"),
    h("h1", null, `Configuration of ${d.functionName}`),
    h("p", { class: "muted" }, `GPU specification ${short(spec.gpuSpecificationId)}, `
      + `revision ${spec.revision}: a new configuration is a new revision, rendered and checked `
      + "as at deploy, then rolled out one instance at a time."),
    formOf("configure-form", "Apply as a new revision", [
      field("Configuration (YAML or JSON)", "configuration",
        { tag: "textarea", rows: 10, value: current }),
    ], async (form) => {
      const configuration = parseConfiguration(value(form, "configuration"), {});
      await send("PATCH",
        `/deployments/${enc(did)}/gpu-specifications/${enc(spec.gpuSpecificationId)}`,
        { configuration });
      location.hash = deploymentHref(did);
    }, can.deploy ? null : NO_DEPLOY));
}

// The revisions of the deployment's specifications: current and target, each earlier one with
// a roll-back button (asked first).
async function revisionsSection(d, can) {
  const rows = [];
  for (const spec of d.deploymentSpecifications) {
    const path = `/deployments/${enc(d.deploymentId)}/gpu-specifications/${enc(spec.gpuSpecificationId)}`;
    const found = await optional(api(`${path}/revisions`));
    for (const r of found.value ? found.value.revisions : []) {
      rows.push(h("tr", { "data-revision": r.revision },
        h("td", null, String(r.revision)),
        h("td", null, [r.current ? "current" : "", r.target && !r.current ? "target" : ""]
          .filter(Boolean).join(", ")),
        h("td", { class: "mono" }, JSON.stringify(r.configuration || {})),
        h("td", null, r.createdBy || ""),
        h("td", null, when(r.createdAt)),
        h("td", null, r.target ? "" : dangerButton(`rollback-${r.revision}`, "Roll back",
          `Roll ${d.functionName} back to revision ${r.revision}?`, async () => {
            await send("POST", `${path}/revisions/${r.revision}/rollback`, {});
          }, can.deploy ? null : NO_DEPLOY))));
    }
  }
  return rows.length
    ? table("revisions", plural(rows.length, "revision"),
        ["Revision", "", "Configuration", "By", "Created", ""], rows)
    : h("p", { id: "revisions", class: "muted" }, "No revisions are shown.");
}

function rolloutText(spec) {
  const r = spec.rollout;
  if (!r) return `revision ${spec.revision}`;
  const progress = r.updatedInstances !== undefined && r.desiredInstances !== undefined
    ? ` ${r.updatedInstances}/${r.desiredInstances}` : "";
  return `revision ${spec.revision}; rollout to ${r.targetRevision}: ${r.state}${progress}`
    + (r.reason ? ` (${r.reason})` : "");
}

// --- usage (docs/usage.md) ---------------------------------------------------------------------

const hours = (seconds) => (seconds / 3600).toFixed(3);

// The account's metered usage over the last 30 days, day by day, and by function.
async function usageView() {
  const since = new Date(Date.now() - 30 * 24 * 3600 * 1000);
  since.setUTCHours(0, 0, 0, 0);
  const body = await api(`/usage?since=${enc(since.toISOString())}&step=day&by=function`);
  const most = Math.max(1, ...body.series.map((p) => p.gpuSeconds));
  const days = body.series.map((p) => h("tr", null,
    h("td", null, h("time", { datetime: p.since }, p.since.slice(0, 10))),
    h("td", { class: "num" }, hours(p.gpuSeconds), " ",
      h("meter", { min: 0, max: most, value: p.gpuSeconds, "aria-hidden": "true" })),
    h("td", { class: "num" }, hours(p.notReadyGpuSeconds)),
    h("td", { class: "num" }, String(p.invocations)),
    h("td", { class: "num" }, String(p.inputTokens)),
    h("td", { class: "num" }, String(p.outputTokens))));
  const groups = body.usage.map((r) => h("tr", null,
    h("td", { class: "mono" }, r.functionId || (r.taskId ? `task ${r.taskId}` : "")),
    h("td", { class: "num" }, hours(r.gpuSeconds)),
    h("td", { class: "num" }, hours(r.notReadyGpuSeconds)),
    h("td", { class: "num" }, String(r.invocations)),
    h("td", { class: "num" }, String(r.inputTokens)),
    h("td", { class: "num" }, String(r.outputTokens))));
  const measures = ["GPU-hours", "Never ready GPU-hours", "Invocations", "Input tokens",
    "Output tokens"];
  return h("div", null,
    h("h1", null, `Usage of ${body.account}`),
    h("p", { class: "muted" }, `From ${utc(body.since)} to ${utc(body.until)}: GPU-hours from `
      + "each instance's first Running to its end; instances that never became ready apart."),
    table("usage-days", "Per day", ["Day", ...measures], days),
    groups.length
      ? table("usage-functions", plural(groups.length, "function or task"),
          ["Function or task", ...measures], groups)
      : h("p", { class: "muted" }, "Nothing metered in this period."));
}

// --- routing and refresh ----------------------------------------------------------------------

// [pattern, view, refreshed]: forms and streams are not refreshed (what is typed stays)
// --- cloud tasks (NVCT, docs/tasks.md) ---------------------------------------------------------

const TASK_ENDS = ["COMPLETED", "CANCELED", "ERRORED", "EXCEEDED_MAX_RUNTIME_DURATION",
  "EXCEEDED_MAX_QUEUED_DURATION"];
const taskHref = (tid) => `#/tasks/${enc(tid)}`;

function percentBar(task) {
  const percent = task.percentComplete;
  if (percent === undefined || percent === null) return h("span", { class: "muted" }, "—");
  return h("span", { class: "percent" },
    h("progress", { max: 100, value: percent, "aria-label": `${percent}% complete` }), ` ${percent}%`);
}

// Every page of a cursor-paged NVCT list (its `limit` and `cursor`), at most `pages` of them.
async function nvctPages(path, key, pages = 20, limit = 100) {
  const items = [];
  let cursor = null;
  const sep = path.includes("?") ? "&" : "?";
  const first = `${path}${sep}limit=${limit}`;
  for (let i = 0; i < pages; i += 1) {
    const body = await api(cursor ? `${first}&cursor=${enc(cursor)}` : first, NVCT);
    items.push(...(body[key] || []));
    cursor = body.cursor;
    if (!cursor) break;
  }
  return items;
}

async function tasksView() {
  const tasks = await nvctPages("/tasks", "tasks");
  const rows = tasks.map((t) => h("tr", { "data-task-id": t.id },
    h("td", null, link(taskHref(t.id), t.name, { title: t.id })),
    h("td", null, badge("status", t.status)),
    h("td", null, percentBar(t)),
    h("td", { class: "mono" }, `${t.gpuSpecification.gpu} ${t.gpuSpecification.instanceType}`),
    h("td", { class: "mono" }, t.containerImage || (t.helmChart ? `chart ${t.helmChart}` : "")),
    h("td", null, when(t.createdAt))));
  return h("div", null,
    h("h1", null, "Tasks"),
    rows.length
      ? table("tasks", plural(rows.length, "task"),
          ["Task", "Status", "Progress", "GPU", "Runs", "Created"], rows)
      : h("p", { class: "muted" }, "No tasks yet."));
}

async function taskView(tid) {
  const base = `/tasks/${enc(tid)}`;
  const [{ task: t }, events, results] = await Promise.all([
    api(base, NVCT), nvctPages(`${base}/events`, "events"), nvctPages(`${base}/results`, "results"),
  ]);
  const ended = TASK_ENDS.includes(t.status);
  const error = t.healthInfo && t.healthInfo.error;
  return h("div", null,
    h("p", { class: "crumbs" }, link("#/tasks", "Tasks"), " / ", t.name),
    h("h1", null, `${t.name} `, h("span", { id: "task-status" }, badge("status", t.status))),
    h("p", { id: "task-progress" }, percentBar(t)),
    details([
      ["Task", h("code", null, t.id)],
      ["GPU", `${t.gpuSpecification.gpu} ${t.gpuSpecification.instanceType}`],
      ["Runs", t.containerImage || t.helmChart || ""],
      ["Results", t.resultsLocation ? `${t.resultHandlingStrategy} to ${t.resultsLocation}`
        : t.resultHandlingStrategy],
      ["Max runtime", t.maxRuntimeDuration || "none"],
      ["Max queued", t.maxQueuedDuration],
      ["Grace period", t.terminationGracePeriodDuration],
      ["Last heartbeat", t.lastHeartbeatAt ? when(t.lastHeartbeatAt) : "—"],
      ["Created", when(t.createdAt)],
    ]),
    h("p", { class: "actions", id: "task-actions" },
      ended ? null : dangerButton("cancel-task", "Cancel",
        `Cancel task ${t.name}? Its container is asked to stop, then killed after the grace period.`,
        async () => {
          await send("POST", `${base}/cancel`, undefined, NVCT);
          load(generation);
        }),
      " ", dangerButton("delete-task", "Delete", `Delete task ${t.name}?`, async () => {
        await send("DELETE", base, undefined, NVCT);
        location.hash = "#/tasks";
      }),
      " ", link(`${taskHref(tid)}/logs`, "Logs", { id: "task-logs-link", class: "button" })),
    error ? h("div", { id: "task-health", class: "problems", role: "alert" },
      h("h2", null, "Health"), h("p", null, error)) : null,
    h("h2", null, "Results"),
    results.length
      ? table("task-results", plural(results.length, "result"),
          ["Name", "Created", "Reference", "Digest", "Metadata"],
          results.map((r) => h("tr", null,
            h("td", null, r.name), h("td", null, when(r.createdAt)),
            h("td", { class: "mono" }, r.reference || "—"),
            h("td", { class: "mono" }, r.digest || "—"),
            h("td", { class: "mono" },
              Object.keys(r.metadata || {}).length ? JSON.stringify(r.metadata) : ""))))
      : h("p", { id: "task-results", class: "muted" }, "No results reported."),
    h("h2", null, "Event timeline"),
    table("task-events", plural(events.length, "event"), ["At (UTC)", "Message"],
      events.map((e) => h("tr", null,
        h("td", { class: "mono" }, h("time", { datetime: e.createdAt, title: e.createdAt },
          utc(e.createdAt, false))),
        h("td", null, e.message)))));
}

async function taskLogsView(tid) {
  const { task: t } = await api(`/tasks/${enc(tid)}`, NVCT);
  const out = h("pre", { id: "log", class: "log", "aria-live": "off", tabindex: 0 });
  const state = h("p", { id: "log-state", class: "muted" });
  followLog(`${NVCT}/tasks/${enc(tid)}/logs`, state, out,
    "the log ended (the task's container ended, or it has not started).");
  return h("div", null,
    h("p", { class: "crumbs" }, link("#/tasks", "Tasks"), " / ", link(taskHref(tid), t.name),
      " / logs"),
    h("h1", null, `Logs of ${t.name}`),
    state, out);
}

// --- telemetry endpoints (docs/telemetry.md) ----------------------------------------------------

const TELEMETRY_FIELDS = [
  ["logsTelemetryId", "LOGS"],
  ["metricsTelemetryId", "METRICS"],
  ["tracesTelemetryId", "TRACES"],
];
const TELEMETRY_TYPES = TELEMETRY_FIELDS.map(([, type]) => type);
// the providers a wire of this server serves (service/observability/wires.py); the API says
// which when another is chosen
const TELEMETRY_PROVIDERS = ["OTEL_COLLECTOR", "GRAFANA_CLOUD", "PROMETHEUS", "VICTORIAMETRICS",
  "KRATOS_THANOS", "DATADOG"];

function lastOutcome(at, text) {
  return at ? h("span", null, when(at), text ? h("br") : null, text ? h("span", { class: "error" }, text) : null) : "—";
}

async function telemetriesView() {
  const { telemetries } = await api("/telemetries");
  const rows = telemetries.map((t) => {
    const s = t.status || {};
    return h("tr", { "data-telemetry-id": t.telemetryId },
      h("td", null, h("strong", null, t.name), h("br"),
        h("code", { title: t.telemetryId }, short(t.telemetryId))),
      h("td", null, `${t.provider} (${t.protocol})`),
      h("td", { class: "mono" }, t.endpoint),
      h("td", null, (t.types || []).join(", ")),
      h("td", { class: "last-success" }, lastOutcome(s.lastSuccessAt)),
      h("td", { class: "last-error" }, lastOutcome(s.lastErrorAt, s.lastError)),
      h("td", { class: "dropped" }, String(s.dropped || 0)),
      h("td", null, dangerButton(`delete-${t.telemetryId}`, "Delete",
        `Delete the telemetry endpoint ${t.name}? A function version naming it keeps it.`,
        async () => {
          await send("DELETE", `/telemetries/${enc(t.telemetryId)}`);
          start();
        })));
  });
  return h("div", null,
    h("h1", null, "Telemetry endpoints"),
    h("p", { class: "actions" },
      link("#/telemetries/new", "Add an endpoint", { id: "new-telemetry", class: "button" })),
    rows.length
      ? table("telemetries", plural(rows.length, "endpoint"),
          ["Name", "Provider", "Endpoint", "Types", "Last success", "Last error", "Dropped", ""],
          rows)
      : h("p", { class: "muted" }, "No telemetry endpoints yet."));
}

async function newTelemetryView() {
  const select = (id, options) => {
    const node = field(id.charAt(0).toUpperCase() + id.slice(1), id, { tag: "select", required: true });
    add(node.querySelector("select"), options.map((o) => h("option", { value: o }, o)));
    return node;
  };
  return h("div", null,
    h("p", { class: "crumbs" }, link("#/telemetries", "Telemetry endpoints"), " / new"),
    h("h1", null, "New telemetry endpoint"),
    formOf("telemetry-form", "Add the endpoint", [
      field("Name", "name", { required: true, maxlength: 48 }),
      field("Endpoint", "endpoint", { required: true, placeholder: "https://… (DATADOG: a site such as datadoghq.com)" }),
      select("provider", TELEMETRY_PROVIDERS),
      select("protocol", ["HTTP", "GRPC"]),
      h("fieldset", { id: "types", "data-field": "types" },
        h("legend", null, "Types"),
        TELEMETRY_TYPES.map((type) => h("label", { class: "check" },
          h("input", { type: "checkbox", id: `type-${type}`, value: type }), ` ${type}`)),
        h("span", { id: "types-error", class: "field-error error", role: "alert" })),
      field("Key", "key", { type: "password", autocomplete: "off", required: true, field: "value" },
        "write-only: stored encrypted, never shown again (GRAFANA_CLOUD: instanceId:token)"),
    ], async (form) => {
      const types = TELEMETRY_TYPES.filter((type) => form.querySelector(`#type-${type}`).checked);
      await send("POST", "/telemetries", {
        endpoint: value(form, "endpoint"),
        provider: value(form, "provider"),
        protocol: value(form, "protocol"),
        types,
        secret: { name: value(form, "name"), value: form.querySelector("#key").value },
      });
      location.hash = "#/telemetries";
    }));
}

const ROUTES = [
  [/^#\/functions\/([^/]+)\/versions\/([^/]+)$/, versionView, true],
  [/^#\/functions\/([^/]+)\/versions\/([^/]+)\/deploy$/, deployView, false],
  [/^#\/functions\/([^/]+)\/versions\/([^/]+)\/invoke$/, invokeView, false],
  [/^#\/deployments\/([^/]+)\/scale$/, scaleView, false],
  [/^#\/deployments\/([^/]+)\/logs$/, logsView, false],
  [/^#\/deployments\/([^/]+)\/configure$/, configureView, false],
  [/^#\/deployments\/([^/]+)$/, deploymentView, true],
  [/^#\/deployments$/, deploymentsView, true],
  [/^#\/functions$/, functionsView, true],
  [/^#\/tasks\/([^/]+)\/logs$/, taskLogsView, false],
  [/^#\/tasks\/([^/]+)$/, taskView, true],
  [/^#\/tasks$/, tasksView, true],
  [/^#\/telemetries\/new$/, newTelemetryView, false],
  [/^#\/telemetries$/, telemetriesView, true],
  [/^#\/usage$/, usageView, true],
  [/^#\/new(\?.*)?$/, newFunctionView, false],
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
  for (const [pattern, view, refreshed] of ROUTES) {
    const match = pattern.exec(location.hash);
    if (match) {
      const args = match.slice(1).filter((a) => a && !a.startsWith("?")).map(decodeURIComponent);
      const run = () => view(...args);
      run.refreshed = refreshed;
      return run;
    }
  }
  return null;
}

// Put a rendered view in place, keeping the keyboard's place: a refresh of the same view gives
// the focus back to the control that had it (by id, or a link by its target), and a new view
// takes the focus to its heading, so Tab continues from there, not from the page's top.
function show(node) {
  const refresh = document.body.dataset.loaded === location.hash;
  const had = document.activeElement;
  const within = had && had !== document.body && $("view").contains(had);
  const id = within ? had.id : "";
  const href = within && !id ? had.getAttribute("href") : null;
  $("view").replaceChildren(node);
  let target = null;
  if (refresh && id) target = document.getElementById(id);
  else if (refresh && href) target = $("view").querySelector(`a[href="${CSS.escape(href)}"]`);
  else if (!refresh) {
    target = $("view").querySelector("h1");
    if (target) target.setAttribute("tabindex", "-1");
  }
  if (target && (!refresh || within)) target.focus({ preventScroll: refresh });
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
    show(node);
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
  if (gen === generation && view.refreshed) {
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
  if (streaming) streaming.abort();
  streaming = null;
  capabilities = null;
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
