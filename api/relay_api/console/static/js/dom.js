// Building the page: h("tag.class", {attributes}, ...children), and how values are shown.

export function h(spec, attrs = {}, ...children) {
  const [tag, ...classes] = spec.split(".");
  const node = document.createElement(tag || "div");
  if (classes.length) node.className = classes.join(" ");
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function statusBadge(status) {
  return h(`span.status.${status}`, { "data-status": status }, status.replace("_", " "));
}

export function when(iso) {
  if (!iso) return "—";
  const moment = new Date(iso);
  return h("time", { datetime: iso, title: iso }, moment.toLocaleString());
}

export function number(value, digits = 4) {
  if (value === null || value === undefined) return "—";
  if (Math.abs(value) >= 1e4 || (value !== 0 && Math.abs(value) < 1e-3)) return value.toExponential(2);
  return Number(value.toPrecision(digits)).toString();
}

// 75 -> "1m15s", 3700 -> "1h01m", as the CLI writes durations (relay.formatting.duration_text).
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const whole = Math.floor(seconds);
  const hours = Math.floor(whole / 3600);
  const minutes = Math.floor((whole % 3600) / 60);
  const secs = whole % 60;
  const two = (n) => String(n).padStart(2, "0");
  if (hours) return `${hours}h${two(minutes)}m`;
  return minutes ? `${minutes}m${two(secs)}s` : `${secs}s`;
}

// Decimal units (1 MB = 1,000,000 bytes), as the CLI writes them (relay.formatting.size_text).
export function bytes(count) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let value = count;
  let unit = 0;
  while (Number(value.toFixed(1)) >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit++;
  }
  return unit === 0 ? `${count} B` : `${value.toFixed(1)} ${units[unit]}`;
}

export function notice(kind, text) {
  return h(`div.notice.${kind}`, { role: kind === "error" ? "alert" : "status" }, text);
}

export function notFound(what) {
  return h(
    "div.notfound",
    { "data-testid": "not-found" },
    h("div.code", {}, "404"),
    h("p", {}, what),
    h("p", {}, h("a", { href: "#/jobs" }, "Back to your fine-tunes")),
  );
}
