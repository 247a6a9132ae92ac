// One message of a conversation as DOM: role, sanitised Markdown (or plain text for the user),
// its images as thumbnails, a collapsed reasoning section, the figures under an answer, and its
// action buttons.

import { thumbnails } from "./attachments.js";
import { renderMarkdown } from "./markdown.js";
import { h, num } from "./dom.js";

/** The line under an answer: tokens, tokens per second, cached prompt tokens, time to first. */
export function statsText(stats) {
  if (!stats) return "";
  const parts = [];
  if (stats.completion_tokens !== undefined) parts.push(`${stats.completion_tokens} tokens`);
  if (stats.tokens_per_s !== undefined) parts.push(`${num(stats.tokens_per_s, 1)} tok/s`);
  if (stats.cached_tokens !== undefined) {
    parts.push(`${stats.cached_tokens} of ${stats.prompt_tokens} prompt tokens cached`);
  }
  if (stats.ttft_s !== undefined) parts.push(`first token ${num(stats.ttft_s * 1000)} ms`);
  if (stats.finish_reason) parts.push(stats.finish_reason);
  return parts.join(" · ");
}

/**
 * A message element. `actions`: {copy, edit, regenerate} callbacks (each optional).
 * Returns {el, update(message)} so a streaming answer re-renders in place.
 */
export function messageView(message, actions) {
  const body = h("div", { class: "body" });
  const reasoningBody = h("div", { class: "reasoning-body" });
  const reasoning = h(
    "details",
    { class: "reasoning", hidden: true },
    h("summary", {}, "Reasoning"),
    reasoningBody,
  );
  const footer = h("div", { class: "stats" });
  const buttons = h("div", { class: "actions" });
  if (actions.copy) buttons.append(h("button", { type: "button", onclick: actions.copy }, "Copy"));
  if (actions.edit) buttons.append(h("button", { type: "button", onclick: actions.edit }, "Edit"));
  if (actions.regenerate) {
    buttons.append(
      h("button", { type: "button", class: "regenerate", onclick: actions.regenerate }, "Regenerate"),
    );
  }
  const el = h(
    "article",
    { class: `message ${message.role}` },
    h("div", { class: "role" }, message.role === "user" ? "You" : "Assistant"),
    reasoning,
    message.images?.length ? h("div", { class: "images" }, thumbnails(message.images)) : null,
    body,
    footer,
    buttons,
  );

  function update(m) {
    if (m.role === "user") body.textContent = m.content;
    else renderMarkdown(body, m.content);
    reasoning.hidden = !m.reasoning;
    if (m.reasoning) reasoningBody.textContent = m.reasoning;
    footer.textContent = statsText(m.stats);
    el.classList.toggle("error", Boolean(m.error));
    if (m.error) footer.textContent = m.error;
  }

  update(message);
  return { el, update };
}

/** An inline editor for a user message: `onSend(text)` or `onCancel()`. */
export function editBox(text, onSend, onCancel) {
  const area = h("textarea", { class: "edit-box", rows: 4 });
  area.value = text;
  setTimeout(() => area.focus());
  return h(
    "div",
    { class: "editor" },
    area,
    h("button", { type: "button", class: "send-edit", onclick: () => onSend(area.value) }, "Send"),
    h("button", { type: "button", onclick: onCancel }, "Cancel"),
  );
}
