// Deployments: a table (newest first, cursor paging, refreshing itself) with a form to deploy a
// model, and a page per deployment: its status, where robots connect, what it serves (requests/s,
// latency percentiles, robots connected, as its worker last reported), the model it loaded (what
// its worker's server reads and answers, as fields), its events, and Stop.

import { APIError, get, post, request } from "./api.js";
import { h, notFound, notice, number, statusBadge, when } from "./dom.js";

const PAGE = 20;
const REFRESH_MS = 3000;
const ENDED = new Set(["stopped", "error"]);

export async function deploymentsView(ctx) {
  const cursors = [null];
  let page = 0;
  const body = h("tbody");
  const problem = h("div");
  const previous = h("button", { type: "button", disabled: true, onclick: () => show(page - 1) }, "← Newer");
  const next = h("button", { type: "button", disabled: true, onclick: () => show(page + 1) }, "Older →");
  ctx.root.append(
    h("h1", {}, "Deployments"),
    h("p.muted", {}, "A deployment keeps a tuned model loaded on a serving worker and answers robots' observations with action chunks."),
    deployForm(ctx),
    problem,
    h(
      "table",
      { "data-testid": "deployments" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          ...["ID", "Status", "Model", "Requests/s", "p50 latency", "Robots", "Created", "Ended"].map((name, i) =>
            h(i >= 3 && i <= 5 ? "th.num" : "th", {}, name),
          ),
        ),
      ),
      body,
    ),
    h("div.pager", {}, previous, next),
  );

  async function show(index) {
    const after = cursors[index];
    let answer;
    try {
      answer = await get(`/v1/deployments?limit=${PAGE}` + (after ? `&after=${encodeURIComponent(after)}` : ""));
    } catch (error) {
      if (!ctx.failed(error)) problem.replaceChildren(notice("error", error.message));
      return;
    }
    if (ctx.signal.aborted) return;
    problem.replaceChildren();
    page = index;
    if (answer.data.length) cursors[index + 1] = answer.data[answer.data.length - 1].id;
    body.replaceChildren(
      ...answer.data.map((d) =>
        h(
          "tr",
          { "data-deployment": d.id },
          h("td.mono", {}, h("a", { href: `#/deployments/${d.id}` }, d.id)),
          h("td", {}, statusBadge(d.status)),
          h("td.mono", {}, d.model),
          h("td.num", {}, d.stats ? number(d.stats.requests_per_second, 3) : "—"),
          h("td.num", {}, latency(d.stats, "p50")),
          h("td.num", {}, d.stats ? d.stats.clients : "—"),
          h("td", {}, when(d.created_at)),
          h("td", {}, when(d.ended_at)),
        ),
      ),
    );
    if (!answer.data.length) body.append(h("tr", {}, h("td.muted", { colspan: 8 }, "No deployments.")));
    previous.disabled = page === 0;
    next.disabled = !answer.has_more;
  }

  await show(0);
  ctx.every(REFRESH_MS, () => show(page));
}

// Deploy a model: a completed job's id, or a base model's name. A bad field is shown as the API
// names it.
function deployForm(ctx) {
  const model = h("input", { id: "deploy-model", name: "model", placeholder: "ft-… (a completed job) or pi05-tiny", required: true });
  const maxBatch = h("input", { id: "deploy-max-batch", name: "max_batch", type: "number", min: 1, placeholder: "default" });
  const problem = h("div");
  const submit = h("button.primary", { type: "submit" }, "Deploy");
  return h(
    "form.card.deploy",
    {
      "data-testid": "deploy-form",
      onsubmit: async (event) => {
        event.preventDefault();
        problem.replaceChildren();
        submit.disabled = true;
        const config = { model: model.value.trim() };
        if (maxBatch.value) config.max_batch = Number(maxBatch.value);
        try {
          const created = await post("/v1/deployments", config);
          location.hash = `#/deployments/${created.id}`;
        } catch (error) {
          if (!ctx.failed(error)) problem.replaceChildren(notice("error", error.message));
        } finally {
          submit.disabled = false;
        }
      },
    },
    h("label", { for: "deploy-model" }, "Model"),
    model,
    h("label", { for: "deploy-max-batch" }, "Max batch"),
    maxBatch,
    problem,
    submit,
  );
}

// Deploy a completed job's output from its page: the button of its "use this model" block.
export function deployButton(ctx, jobId, messages) {
  const button = h("button.primary", { type: "button", "data-testid": "deploy-job" }, "Deploy this model");
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const created = await post("/v1/deployments", { model: jobId });
      location.hash = `#/deployments/${created.id}`;
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", `Could not deploy (${error.status}): ${error.message}`));
      button.disabled = false;
    }
  });
  return button;
}

function latency(stats, percentile) {
  const value = stats && stats.latency_ms ? stats.latency_ms[percentile] : null;
  return value === null || value === undefined ? "—" : `${number(value, 3)} ms`;
}

export async function deploymentView(ctx, id) {
  let deployment;
  try {
    deployment = await get(`/v1/deployments/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error instanceof APIError && error.status === 404) {
      ctx.root.append(notFound(error.message));
      return;
    }
    throw error;
  }
  const title = h("h1");
  const messages = h("div", { "data-testid": "messages" });
  const details = h("dl.kv", { "data-testid": "deployment" });
  const figures = h("dl.kv", { "data-testid": "serving-stats" });
  const model = h("dl.kv", { "data-testid": "deployment-model" });
  const connect = h("pre.code", { "data-testid": "connect" });
  const events = h("tbody");
  const stop = h("button.danger", { type: "button", onclick: stopDeployment }, "Stop");
  ctx.root.append(
    title,
    messages,
    h("div.card", {}, details),
    h("h2", {}, "Serving"),
    h("p.muted", {}, "As the serving worker last reported (with each lease renewal)."),
    h("div.card", {}, figures),
    h("h2", {}, "Model"),
    h("div.card", {}, model),
    h("h2", {}, "Connect a robot"),
    connect,
    h("h2", {}, "Events"),
    h("table", { "data-testid": "deployment-events" }, h("thead", {}, h("tr", {}, h("th", {}, "When"), h("th", {}, "Event"), h("th.num", {}, "Attempt"), h("th", {}, "Why"))), events),
  );

  function render() {
    title.replaceChildren(`Deployment ${deployment.id}`, statusBadge(deployment.status));
    if (!ENDED.has(deployment.status)) title.append(stop);
    const rows = [
      ["Status", deployment.status],
      ["Model", h("span.mono", {}, deployment.model)],
      ["Max batch", String(deployment.max_batch)],
      ["Batch wait", `${number(deployment.max_wait_ms, 3)} ms`],
      ["Idle timeout", `${number(deployment.idle_timeout_seconds, 6)} s`],
      ["Websocket (openpi-client)", h("span.mono", { "data-url": "websocket" }, deployment.websocket_url)],
      ["Actions (HTTP POST)", h("span.mono", { "data-url": "actions" }, deployment.actions_url)],
      ["Attempt", String(deployment.attempt)],
      ["Created", when(deployment.created_at)],
      ["Ready", when(deployment.ready_at)],
      ["Ended", when(deployment.ended_at)],
    ];
    if (deployment.error) rows.push([deployment.status === "error" ? "Error" : "Why it ended", deployment.error]);
    details.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));

    const stats = deployment.stats;
    const statRows = stats
      ? [
          ["Requests", String(stats.requests)],
          ["Requests/s (last 60 s)", number(stats.requests_per_second, 3)],
          ["Latency p50 / p90 / p99", ["p50", "p90", "p99"].map((p) => latency(stats, p)).join(" / ")],
          ["Robots connected", String(stats.clients)],
          ["Mean batch", stats.mean_batch === null || stats.mean_batch === undefined ? "—" : number(stats.mean_batch, 3)],
        ]
      : [["Figures", deployment.status === "ready" ? "none reported yet" : `none while ${deployment.status}`]];
    figures.replaceChildren(...statRows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-stat": k }, v)]));
    model.replaceChildren(...modelRows(deployment).flatMap(([key, label, v]) => [h("dt", {}, label), h("dd", { "data-field": key }, v)]));

    const host = deployment.websocket_url.replace(/^wss?:\/\//, "");
    connect.textContent = [
      "from openpi_client.websocket_client_policy import WebsocketClientPolicy",
      "",
      `policy = WebsocketClientPolicy(host="${host}", port=None, api_key=RELAY_API_KEY)`,
      'chunk = policy.infer({"images": {...}, "state": state, "prompt": "..."})["actions"]',
    ].join("\n");
  }

  async function showEvents() {
    let answer;
    try {
      answer = await get(`/v1/deployments/${encodeURIComponent(deployment.id)}/events?limit=100`);
    } catch (error) {
      ctx.failed(error);
      return;
    }
    events.replaceChildren(
      ...answer.data
        .slice()
        .reverse()
        .map((e) => h("tr", { "data-event": e.event }, h("td", {}, when(e.created_at)), h("td", {}, e.event), h("td.num", {}, e.attempt), h("td", {}, e.reason ?? ""))),
    );
  }

  async function refresh() {
    try {
      deployment = await get(`/v1/deployments/${encodeURIComponent(deployment.id)}`);
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", error.message));
      return;
    }
    render();
    showEvents();
  }

  async function stopDeployment() {
    stop.disabled = true;
    try {
      deployment = await request("DELETE", `/v1/deployments/${encodeURIComponent(deployment.id)}`);
      messages.replaceChildren(notice("info", ENDED.has(deployment.status) ? "Stopped." : "Stopping."));
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", `Could not stop (${error.status}): ${error.message}`));
    } finally {
      stop.disabled = false;
    }
    render();
  }

  render();
  showEvents();
  ctx.every(REFRESH_MS, () => {
    if (!ENDED.has(deployment.status)) refresh();
  });
}

// What the loaded model reads and answers (the worker's metadata), as labelled fields.
const INFO_LABELS = {
  model: "Model",
  kind: "Kind",
  cameras: "Cameras",
  camera_slots: "Camera slots",
  cameras_required: "Every camera required",
  state_dim: "State width",
  action_dim: "Action width",
  action_horizon: "Actions a chunk",
  num_steps: "Sampler steps",
  raw_units: "Robot's own units",
  device: "Device",
  task: "Task",
  problem_type: "Problem type",
  prediction: "Prediction",
  target: "Target",
  entity: "Entity",
  latest_time: "Latest time",
  database: "Database",
  tables: "Tables",
  context_length: "Context length",
};

function modelRows(deployment) {
  const info = deployment.info;
  if (!info) return [["model", "Model", deployment.status === "ready" ? "not reported" : `not loaded (${deployment.status})`]];
  const known = Object.keys(INFO_LABELS).filter((key) => key in info);
  const others = Object.keys(info).filter((key) => !(key in INFO_LABELS));
  return [...known, ...others].map((key) => [key, INFO_LABELS[key] || key.replaceAll("_", " "), infoText(key, info[key])]);
}

function infoText(key, value) {
  if (value === null || value === undefined) return key === "state_dim" ? "any, up to 32 (normalized)" : "—";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.map((item) => infoText("", item)).join(", ");
  if (key === "camera_slots") return Object.entries(value).map(([camera, slot]) => `${camera} → ${slot}`).join(", ");
  if (key === "tables") return Object.entries(value).map(([name, table]) => `${name} (${table && table.rows !== undefined ? `${table.rows} rows` : "—"})`).join(", ");
  if (typeof value === "object") return Object.entries(value).map(([name, item]) => `${name} ${infoText(name, item)}`).join(", ");
  return String(value);
}
