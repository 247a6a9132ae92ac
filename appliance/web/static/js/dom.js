// Building DOM nodes: strings become text nodes (never HTML), so server and model text is inert.

/** h("div", {class: "x", onclick: fn}, "text", child) -> an element. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export const $ = (selector, root = document) => root.querySelector(selector);

export const NA = "n/a";

/** A number with `digits` decimals, or n/a. */
export function num(value, digits = 0) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : NA;
}

/** Seconds as ms below one second, else s to three significant digits (1.23 s, 52.1 s, 123 s):
 * the dashboard's narrow cards hold a row of them. */
export function seconds(value) {
  if (typeof value !== "number") return NA;
  if (value < 1) return `${(value * 1000).toFixed(0)} ms`;
  return `${value.toFixed(value < 10 ? 2 : value < 100 ? 1 : 0)} s`;
}

export function bytes(value) {
  if (typeof value !== "number") return NA;
  const gib = value / 1024 ** 3;
  return gib >= 1 ? `${gib.toFixed(2)} GiB` : `${(value / 1024 ** 2).toFixed(0)} MiB`;
}
