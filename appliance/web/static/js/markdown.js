// Model text to DOM: marked (Markdown -> HTML), then DOMPurify (nothing that runs survives),
// then highlight.js on the code blocks. The HTML string never reaches the DOM unsanitised.

import { marked } from "/web/vendor/marked/marked.esm.js";
import DOMPurify from "/web/vendor/dompurify/purify.es.mjs";
import hljs from "/web/vendor/highlight/highlight.min.js";

marked.setOptions({ gfm: true, breaks: false });

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
