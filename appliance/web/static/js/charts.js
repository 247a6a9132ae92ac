// Sparklines (inline SVG) and gauges, drawn by the page's own code; the history behind them.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 120;
const HEIGHT = 30;
export const HISTORY_LEN = 120; // samples per sparkline: ~30 s at four stats documents a second

/** Ring buffers of named series. */
export class History {
  constructor(size = HISTORY_LEN) {
    this.size = size;
    this.series = new Map();
  }

  push(name, value) {
    const ring = this.series.get(name) || [];
    ring.push(typeof value === "number" && Number.isFinite(value) ? value : 0);
    if (ring.length > this.size) ring.shift();
    this.series.set(name, ring);
    return ring;
  }
}

/** An <svg> sparkline element to redraw with `drawSparkline`. */
export function sparkline(label) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "sparkline");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const line = document.createElementNS(SVG, "polyline");
  svg.append(line);
  return svg;
}

/** Draw `values` scaled to `max` (by default the largest value, at least 1). */
export function drawSparkline(svg, values, max) {
  const top = max ?? Math.max(1, ...values);
  const step = WIDTH / Math.max(1, HISTORY_LEN - 1);
  const offset = WIDTH - step * (values.length - 1);
  const points = values.map((v, i) => {
    const y = HEIGHT - 1 - (Math.min(v, top) / top) * (HEIGHT - 2);
    return `${(offset + i * step).toFixed(1)},${y.toFixed(1)}`;
  });
  svg.firstChild.setAttribute("points", points.join(" "));
}

/** Set a gauge (a .gauge element holding a .fill) to `perc` percent. */
export function drawGauge(gauge, perc) {
  const value = typeof perc === "number" ? Math.max(0, Math.min(100, perc)) : 0;
  gauge.firstChild.style.width = `${value}%`;
  gauge.classList.toggle("high", value >= 90);
  gauge.setAttribute("aria-valuenow", value.toFixed(0));
}
