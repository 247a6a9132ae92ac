// The dashboard view: follows /v1/stats/stream while shown (reconnecting after a break) and draws
// the figures `appliance top` shows: KV and prefix cache, queue, throughput, latency, GPU,
// requests with their traces, the memory plan and, for an admin key (GET /v1/key), the usage
// by key.

import { apiFetch, getJSON } from "./api.js";
import { History, drawGauge, drawSparkline, sparkline } from "./charts.js";
import { gpuRows, keyRows, latencyRows, planRows, requestRows, traceView } from "./dash_panels.js";
import { $, fill, num, seconds } from "./dom.js";
import { sseData } from "./sse.js";

const RETRY_MS = 1000;
const SERIES = {
  kv: (d) => d.engine?.kv_usage_perc,
  hit: (d) => d.kv?.prefix_cache?.hit_rate_perc,
  waiting: (d) => d.queue?.num_waiting,
  running: (d) => d.queue?.num_running,
  tps: (d) => d.throughput?.generation_tokens_per_s,
  ttft: (d) => d.latency?.ttft_s?.p50,
  tpot: (d) => d.latency?.tpot_s?.p50,
};
const PERCENT_SERIES = new Set(["kv", "hit"]);

export class Dashboard {
  constructor() {
    this.history = new History();
    this.controller = null;
    this.doc = null;
    this.isAdmin = false;
    this.lines = {};
    for (const slot of document.querySelectorAll(".spark[data-series]")) {
      const name = slot.dataset.series;
      this.lines[name] = sparkline(name);
      slot.replaceChildren(this.lines[name]);
    }
  }

  /** Follow the stream until `stop()`. */
  async start() {
    if (this.controller) return;
    const controller = new AbortController();
    this.controller = controller;
    while (!controller.signal.aborted) {
      try {
        this.isAdmin = (await getJSON("/v1/key", { signal: controller.signal })).admin === true;
        const response = await apiFetch("/v1/stats/stream", { signal: controller.signal });
        this.status("connected");
        for await (const data of sseData(response)) this.ingest(JSON.parse(data));
        this.status("the server closed the stream");
      } catch (error) {
        if (controller.signal.aborted) break;
        this.status(`disconnected: ${error.message}`);
        if (error.status === 401) break;
      }
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  }

  stop() {
    this.controller?.abort();
    this.controller = null;
  }

  status(text) {
    $("#dash-connection").textContent = text;
  }

  ingest(doc) {
    this.doc = doc;
    for (const [name, read] of Object.entries(SERIES)) {
      const values = this.history.push(name, read(doc));
      drawSparkline(this.lines[name], values, PERCENT_SERIES.has(name) ? 100 : undefined);
    }
    const kv = doc.kv || {};
    const hit = kv.prefix_cache?.hit_rate_perc;
    $("#dash-model").textContent = `${doc.model ?? ""} · ${doc.status ?? ""} · ${doc.device ?? ""}`;
    drawGauge($("#kv-gauge"), doc.engine?.kv_usage_perc);
    $("#kv-text").textContent =
      `${num(doc.engine?.kv_usage_perc, 1)} % · ${num(kv.blocks_used)} of ${num(kv.blocks_total)} blocks`;
    $("#hit-text").textContent = kv.prefix_cache?.enabled === false ? "off" : hit == null ? "n/a" : `${num(hit, 1)} %`;
    const q = doc.queue || {};
    $("#queue-text").textContent =
      `${num(q.num_running)} running · ${num(q.num_waiting)} waiting · ${num(q.rejected_total)} rejected`;
    const t = doc.throughput || {};
    $("#tps-text").textContent =
      `${num(t.generation_tokens_per_s, 1)} gen tok/s · ${num(t.prompt_tokens_per_s, 1)} prompt tok/s`;
    $("#ttft-text").textContent = seconds(doc.latency?.ttft_s?.p50);
    $("#tpot-text").textContent = seconds(doc.latency?.tpot_s?.p50);
    fill($("#latency-table tbody"), latencyRows(doc.latency));
    fill($("#gpu-table tbody"), gpuRows(doc.gpu));
    fill($("#requests-table tbody"), requestRows(doc, (id) => this.showTrace(id)));
    fill($("#plan-table tbody"), planRows(doc.plan, doc.config));
    const showKeys = Boolean(doc.server?.auth) && this.isAdmin;
    $("#keys-section").hidden = !showKeys;
    fill($("#keys-table tbody"), showKeys ? keyRows(doc.keys) : []);
  }

  async showTrace(id) {
    const panel = $("#trace");
    try {
      const trace = await getJSON(`/v1/requests/${encodeURIComponent(id)}`);
      fill(panel, traceView(trace));
    } catch (error) {
      fill(panel, `no trace for ${id}: ${error.message}`);
    }
  }
}
