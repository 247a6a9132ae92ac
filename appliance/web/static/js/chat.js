// The chat view: settings, the message list, sending with a streamed answer (SSE from
// /v1/chat/completions), stop, regenerate, edit-and-resend, copy and attached images. The
// selected model's /v1/models entry decides which controls show: thinking for a model that
// reasons, attaching for one that takes images.

import { apiFetch, getJSON } from "./api.js";
import { Attachments, apiContent, takesImages } from "./attachments.js";
import { editBox, messageView } from "./chat_view.js";
import { $, fill, h } from "./dom.js";
import { sseData } from "./sse.js";

const SETTINGS = "appliance.chatSettings";

export class Chat {
  constructor(store, showError) {
    this.store = store;
    this.showError = showError;
    this.controller = null;
    this.list = $("#messages");
    this.prompt = $("#prompt");
    this.fields = {
      model: $("#model"),
      system: $("#system-prompt"),
      temperature: $("#temperature"),
      max_tokens: $("#max-tokens"),
      thinking: $("#thinking"),
    };
    this.models = new Map();
    this.attachments = new Attachments(showError);
    this.restoreSettings();
    for (const field of Object.values(this.fields)) {
      field.addEventListener("change", () => this.saveSettings());
    }
    this.fields.model.addEventListener("change", () => this.applyModel());
    $("#composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        this.send();
      }
    });
    $("#stop").addEventListener("click", () => this.stop());
    store.onChange(() => this.render());
  }

  restoreSettings() {
    const saved = JSON.parse(localStorage.getItem(SETTINGS) || "{}");
    const f = this.fields;
    f.system.value = saved.system ?? "";
    f.temperature.value = saved.temperature ?? "0.7";
    f.max_tokens.value = saved.max_tokens ?? "";
    f.thinking.checked = saved.thinking ?? true;
  }

  saveSettings() {
    const f = this.fields;
    const settings = {
      model: f.model.value,
      system: f.system.value,
      temperature: f.temperature.value,
      max_tokens: f.max_tokens.value,
      thinking: f.thinking.checked,
    };
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
  }

  /** Fill the model picker from /v1/models. */
  async loadModels() {
    const doc = await getJSON("/v1/models");
    const saved = JSON.parse(localStorage.getItem(SETTINGS) || "{}").model;
    this.models = new Map((doc.data || []).map((m) => [String(m.id), m]));
    const ids = [...this.models.keys()];
    fill(this.fields.model, ids.map((id) => h("option", { value: id }, id)));
    if (ids.includes(saved)) this.fields.model.value = saved;
    this.applyModel();
  }

  /** The selected model's card, or undefined. */
  model() {
    return this.models.get(this.fields.model.value);
  }

  /** Show the controls the selected model has a use for. */
  applyModel() {
    const card = this.model();
    $("#thinking-setting").hidden = card?.reasoning !== true;
    this.attachments.enable(takesImages(card));
  }

  conversation() {
    return this.store.get(this.store.currentId()) || this.store.create();
  }

  get busy() {
    return this.controller !== null;
  }

  render() {
    const c = this.conversation();
    const views = c.messages.map((m, i) => this.view(c, m, i));
    fill(this.list, views.map((v) => v.el));
    this.list.scrollTop = this.list.scrollHeight;
    return views;
  }

  view(c, message, index) {
    const isLast = index === c.messages.length - 1;
    const actions = { copy: () => copyText(message.content) };
    if (message.role === "user") actions.edit = () => this.edit(c, index, view.el);
    if (message.role === "assistant" && isLast) actions.regenerate = () => this.regenerate();
    const view = messageView(message, actions);
    return view;
  }

  send() {
    const text = this.prompt.value.trim();
    if (this.busy || (!text && !this.attachments.images.length)) return;
    const c = this.conversation();
    const images = this.attachments.take();
    c.messages.push(images.length ? { role: "user", content: text, images } : { role: "user", content: text });
    this.prompt.value = "";
    this.store.touch(c);
    return this.generate(c);
  }

  regenerate() {
    const c = this.conversation();
    if (this.busy || c.messages.at(-1)?.role !== "assistant") return;
    c.messages.pop();
    return this.generate(c);
  }

  edit(c, index, el) {
    if (this.busy) return;
    const { images } = c.messages[index];
    const box = editBox(
      c.messages[index].content,
      (text) => {
        if (!text.trim() && !images?.length) return;
        c.messages.splice(index);
        c.messages.push({ role: "user", content: text.trim(), ...(images?.length && { images }) });
        this.store.touch(c);
        this.generate(c);
      },
      () => box.remove(),
    );
    el.after(box);
  }

  stop() {
    this.controller?.abort();
  }

  requestBody(messages) {
    const f = this.fields;
    const body = {
      model: f.model.value || undefined,
      messages: [],
      stream: true,
      stream_options: { include_usage: true },
    };
    if (this.model()?.reasoning) body.chat_template_kwargs = { enable_thinking: f.thinking.checked };
    if (f.system.value.trim()) body.messages.push({ role: "system", content: f.system.value });
    for (const m of messages) {
      if (!m.error) body.messages.push({ role: m.role, content: apiContent(m) });
    }
    const temperature = parseFloat(f.temperature.value);
    if (Number.isFinite(temperature)) body.temperature = temperature;
    const maxTokens = parseInt(f.max_tokens.value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    return body;
  }

  setBusy(busy) {
    $("#send").hidden = busy;
    $("#stop").hidden = !busy;
    document.body.classList.toggle("generating", busy);
  }

  /** Stream an answer to the conversation's messages into a new assistant message. */
  async generate(c) {
    const body = this.requestBody(c.messages);
    const answer = { role: "assistant", content: "", reasoning: "" };
    c.messages.push(answer);
    const view = this.render().at(-1);
    const controller = new AbortController();
    this.controller = controller;
    this.setBusy(true);
    const started = performance.now();
    let first = null;
    let chunks = 0;
    let usage = null;
    let finish = null;
    let pending = false;
    const redraw = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        view.update(answer);
        this.list.scrollTop = this.list.scrollHeight;
      });
    };
    try {
      const response = await apiFetch("/v1/chat/completions", { body, signal: controller.signal });
      for await (const data of sseData(response)) {
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(String(chunk.error.message));
        for (const choice of chunk.choices || []) {
          const delta = choice.delta || {};
          if (delta.content) answer.content += delta.content;
          if (delta.reasoning_content) answer.reasoning += delta.reasoning_content;
          if (delta.content || delta.reasoning_content) {
            first ??= performance.now();
            chunks += 1;
          }
          finish = choice.finish_reason || finish;
        }
        if (chunk.usage) usage = chunk.usage;
        redraw();
      }
    } catch (error) {
      if (error.name === "AbortError") finish = "stopped";
      else answer.error = String(error.message || error);
    } finally {
      const end = performance.now();
      const tokens = usage ? usage.completion_tokens : chunks;
      answer.stats = {
        completion_tokens: tokens,
        finish_reason: finish || undefined,
      };
      if (first !== null) {
        answer.stats.ttft_s = (first - started) / 1000;
        if (end > first && tokens > 1) answer.stats.tokens_per_s = tokens / ((end - first) / 1000);
      }
      if (usage) {
        answer.stats.prompt_tokens = usage.prompt_tokens;
        answer.stats.cached_tokens = usage.prompt_tokens_details?.cached_tokens ?? 0;
      }
      this.controller = null;
      this.setBusy(false);
      this.store.touch(c);
    }
  }
}

/** Copy to the clipboard; over plain HTTP on the LAN (no secure context, so no Clipboard API)
 * through a selected, off-screen text area. */
function copyText(text) {
  if (window.isSecureContext && navigator.clipboard) return navigator.clipboard.writeText(text);
  const area = h("textarea", { class: "offscreen", readonly: true });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}
