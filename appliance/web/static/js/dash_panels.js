// The dashboard's tables from a /v1/stats document: requests, a request's trace timeline, GPU
// readings, latency percentiles, the memory plan and the per-key usage. Text only (textContent).

import { NA, bytes, h, num, seconds } from "./dom.js";

export const REQUEST_COLUMNS = [
  ["id", (r) => r.id],
  ["state", (r) => displayState(r)],
  ["prompt", (r) => num(r.prompt_tokens)],
  ["cached", (r) => num(r.cached_tokens)],
  ["gen", (r) => num(r.completion_tokens)],
  ["queue", (r) => seconds(r.queue_s)],
  ["ttft", (r) => seconds(r.ttft_s)],
  ["tpot", (r) => seconds(r.tpot_s)],
  ["kv", (r) => num(r.kv_blocks)],
  ["pre", (r) => num(r.num_preemptions)],
  ["finish", (r) => (r.finish_reasons || []).filter(Boolean).join(",") || ""],
];

/** The server says running from admission on; without queue time or KV it still waits. */
export function displayState(row) {
  const state = String(row.state ?? "?");
  if ((state === "queued" || state === "running") && row.queue_s == null) {
    return (row.kv_blocks || 0) > 0 ? "running" : "waiting";
  }
  return state;
}

export function requestRows(doc, onSelect) {
  return (doc.requests || []).map((r) =>
    h(
      "tr",
      { class: `state-${displayState(r)}`, dataset: { id: String(r.id) }, onclick: () => onSelect(r.id) },
      REQUEST_COLUMNS.map(([, cell]) => h("td", {}, cell(r))),
    ),
  );
}

/** A request's trace (GET /v1/requests/{id}) as a timeline and a list of events. */
export function traceView(trace) {
  const events = trace.events || [];
  const end = Math.max(1, ...events.map((e) => e.t_ms || 0));
  const bar = h("div", { class: "timeline" });
  for (const e of events) {
    const mark = h("span", { class: `mark ${e.source}`, title: `${e.event} at ${num(e.t_ms, 1)} ms` });
    mark.style.left = `${(100 * (e.t_ms || 0)) / end}%`;
    bar.append(mark);
  }
  const rows = events.map((e) =>
    h(
      "tr",
      {},
      h("td", {}, `${num(e.t_ms, 1)} ms`),
      h("td", {}, e.source + (e.choice !== undefined ? ` ${e.choice}` : "")),
      h("td", {}, e.event),
      h("td", {}, e.detail ? JSON.stringify(e.detail) : ""),
    ),
  );
  return [
    h("h3", {}, `Request ${trace.id}: ${trace.state}, ${num(trace.completion_tokens)} tokens`),
    bar,
    h("table", { class: "events" }, h("tbody", {}, rows)),
  ];
}

export function gpuRows(gpu) {
  const g = gpu || {};
  const memory =
    typeof g.memory_used_bytes === "number" ? `${bytes(g.memory_used_bytes)} / ${bytes(g.memory_total_bytes)}` : NA;
  return keyValueRows([
    ["GPU", g.name ?? NA],
    ["utilization", g.utilization_perc == null ? NA : `${num(g.utilization_perc)} %`],
    ["memory", memory],
    ["power", g.power_w == null ? NA : `${num(g.power_w)} W`],
    ["temperature", g.temperature_c == null ? NA : `${num(g.temperature_c)} °C`],
    ["SM clock", g.sm_clock_mhz == null ? NA : `${num(g.sm_clock_mhz)} MHz`],
  ]);
}

export function latencyRows(latency) {
  const names = { ttft_s: "TTFT", tpot_s: "TPOT", itl_s: "ITL", e2e_s: "end to end", queue_s: "queue" };
  return Object.entries(names).map(([key, label]) => {
    const p = (latency || {})[key] || {};
    return h(
      "tr",
      {},
      h("th", {}, label),
      ["p50", "p90", "p99"].map((q) => h("td", {}, seconds(p[q]))),
      h("td", {}, num(p.count)),
    );
  });
}

const BUDGET_ITEMS = [
  ["budget", "budget_bytes"],
  ["weights", "weight_bytes"],
  ["activation", "activation_bytes"],
  ["CUDA graph pool", "graph_pool_bytes"],
  ["CUDA context", "cuda_context_bytes"],
  ["KV pool", "kv_pool_bytes"],
];

/** The memory plan: each chosen setting with the planner's reason, then the byte budget. */
export function planRows(plan, config) {
  if (!plan || typeof plan !== "object") {
    return keyValueRows(Object.entries(config || {}).map(([k, v]) => [k, valueText(v)]));
  }
  const rows = Object.entries(plan.reasons || {}).map(([key, why]) =>
    h("tr", {}, h("th", {}, key), h("td", {}, valueText(plan[key])), h("td", { class: "why" }, String(why))),
  );
  for (const [label, key] of BUDGET_ITEMS) {
    if (key in plan) rows.push(h("tr", {}, h("th", {}, label), h("td", {}, bytes(plan[key])), h("td")));
  }
  return rows;
}

export function keyRows(keys) {
  return Object.entries(keys || {}).map(([name, k]) =>
    h(
      "tr",
      {},
      h("th", {}, name),
      [k.priority, k.requests_total, k.rejected_total, k.running, k.prompt_tokens_total, k.generation_tokens_total]
        .map((v) => h("td", {}, typeof v === "number" ? num(v) : String(v ?? NA))),
      h("td", {}, seconds(k.queue_seconds_total)),
    ),
  );
}

function keyValueRows(pairs) {
  return pairs.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)));
}

function valueText(value) {
  if (value === null || value === undefined) return NA;
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}
