// Model text to DOM: marked (Markdown -> HTML, the model's own HTML kept as visible text), then
// DOMPurify (nothing that runs survives), then highlight.js on the code blocks. The HTML string
// never reaches the DOM unsanitised.

import { marked } from "/web/vendor/marked/marked.esm.js";
import DOMPurify from "/web/vendor/dompurify/purify.es.mjs";
import hljs from "/web/vendor/highlight/highlight.min.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHTML = (text) => text.replace(/[&<>"']/g, (c) => ESCAPES[c]);

// HTML the model writes is shown as the text it is, never parsed as markup: a chat answer
// holding `<img onerror=...>` reads as that text. DOMPurify still checks what Markdown makes
// (a javascript: link, say).
marked.use({ gfm: true, breaks: false, renderer: { html: (token) => escapeHTML(token.text) } });

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY = { RETURN_DOM_FRAGMENT: true, FORBID_TAGS: ["style", "form", "input", "button"] };

/** Render `text` as sanitised Markdown into `el`, its code blocks highlighted. */
export function renderMarkdown(el, text) {
  const fragment = DOMPurify.sanitize(marked.parse(text), PURIFY);
  for (const code of fragment.querySelectorAll("pre code")) {
    const language = [...code.classList].find((c) => c.startsWith("language-"))?.slice(9);
    if (!language || hljs.getLanguage(language)) hljs.highlightElement(code);
  }
  el.replaceChildren(fragment);
}
