// A fine-tune's page: its status and how it got there, live charts of loss, grad_norm and
// learning rate fed by the API's event stream (and, for a job with a validation split, its
// held-out action error against the blind baseline and its validation loss), the event log, its
// config, its files, Cancel.

import { APIError, download, followEvents, get, post } from "./api.js";
import { LiveChart } from "./charts.js";
import { bytes, h, notFound, notice, number, statusBadge, when } from "./dom.js";
import { recipeSchema } from "./schema.js";

const TERMINAL = new Set(["completed", "cancelled", "error"]);
const POLL_MS = 2000;
// Events that start another attempt of a job, shown in its timeline.
const ATTEMPTS = new Set(["retry", "resumed"]);

// What the engine read, in one line, as relay.events.dataset_line writes it: "lerobot/pusht_image at
// v2.1 (commit 1a2b3c4d), LeRobot v2.1, 206 episodes, 25,650 frames".
function datasetLine(read) {
  const where = read.repo ? `${read.repo} at ${read.revision} (commit ${String(read.sha ?? "?").slice(0, 8)})` : String(read.path);
  const version = read.format ? `LeRobot ${read.format}` : "no codebase_version";
  const count = (n) => Number(n ?? 0).toLocaleString("en-US");
  return `${where}, ${version}, ${count(read.episodes)} episodes, ${count(read.frames)} frames`;
}

// One scoring of the validation split, as relay.events.validation_line writes it: "action error
// 0.0123 vs blind 0.0281 (2.28x better), validation loss 0.104, 48 frames of 4 episodes".
function validationLine(scores) {
  const count = (n) => Number(n ?? 0).toLocaleString("en-US");
  let action = `action error ${number(scores.action_mse)}`;
  if (scores.blind_mse !== null && scores.blind_mse !== undefined) {
    action += ` vs blind ${number(scores.blind_mse)}`;
    if (scores.action_mse > 0) {
      const ratio = scores.blind_mse / scores.action_mse;
      action += ratio >= 1 ? ` (${ratio.toFixed(2)}x better)` : ` (${(1 / ratio).toFixed(2)}x worse)`;
    }
  }
  const episodes = `${count(scores.episodes)} episode${scores.episodes === 1 ? "" : "s"}`;
  return `${action}, validation loss ${number(scores.validation_loss)}, ${count(scores.frames)} frames of ${episodes}`;
}

// The job's validation block (best and last), a line each.
function validationSummary(block) {
  const lines = [h("div", { "data-validation": "best" }, `best at step ${block.best.step}: ${validationLine(block.best)}`)];
  if (block.last.step !== block.best.step) lines.push(h("div", { "data-validation": "last" }, `last at step ${block.last.step}: ${validationLine(block.last)}`));
  return lines;
}

// What an event reports (relay.events): the API names every event's `kind`; "metrics" or its `event`.
function kindOf(event) {
  return event.kind ?? event.event ?? "metrics";
}

export async function jobView(ctx, id) {
  let job;
  try {
    job = await get(`/v1/fine-tunes/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error instanceof APIError && error.status === 404) {
      ctx.root.append(notFound(error.message));
      return;
    }
    throw error;
  }
  const { fields } = await recipeSchema();

  const title = h("h1", {}, `Fine-tune ${job.id}`);
  const messages = h("div", { "data-testid": "messages" });
  const summary = h("dl.kv");
  const timeline = h("ol.timeline", { "data-testid": "timeline" });
  // A job with a validation split: its held-out curves beside the training loss.
  const validated = job.validation_episodes !== null && job.validation_episodes !== undefined;
  const charts = {
    loss: new LiveChart("loss", "loss", "#1f4e79"),
    ...(validated
      ? {
          action_mse: new LiveChart("action_mse", "held-out action error", "#6941c6", { title: "blind baseline", color: "#98a2b3" }),
          validation_loss: new LiveChart("validation_loss", "validation loss", "#c11574"),
        }
      : {}),
    grad_norm: new LiveChart("grad_norm", "grad_norm", "#b54708"),
    lr: new LiveChart("lr", "learning rate", "#067647"),
  };
  ctx.onLeave(() => Object.values(charts).forEach((chart) => chart.destroy()));
  const log = h("tbody");
  const logCount = h("span.muted");
  const files = h("tbody");
  const events = [];
  const cancel = h("button.danger", { type: "button", onclick: cancelJob }, "Cancel");

  ctx.root.append(
    title,
    messages,
    h("div.card", {}, summary, h("h2", {}, "Status"), timeline),
    h("h2", {}, "Training"),
    h("div.grid", {}, ...Object.values(charts).map((chart) => chart.node)),
    h("h2", {}, "Events ", logCount),
    h(
      "div.log",
      {},
      h(
        "table",
        { "data-testid": "events" },
        h("thead", {}, h("tr", {}, h("th.num", {}, "#"), h("th", {}, "Time"), h("th.num", {}, "Step"), h("th", {}, "Event"), h("th", {}, "Details"))),
        log,
      ),
    ),
    h("h2", {}, "Config"),
    h("div.card", {}, configList(job, fields)),
    h("h2", {}, "Files"),
    h(
      "table",
      { "data-testid": "files" },
      h("thead", {}, h("tr", {}, h("th", {}, "Path"), h("th.num", {}, "Size"), h("th", {}, "sha256"), h("th", {}, ""))),
      files,
    ),
  );
  for (const chart of Object.values(charts)) chart.draw();

  function render() {
    title.replaceChildren(`Fine-tune ${job.id}`, statusBadge(job.status));
    if (!TERMINAL.has(job.status) && job.status !== "cancel_requested") title.append(cancel);
    const rows = [
      ["Name", job.name ?? "—"],
      ["Model", job.model],
      ["Dataset", job.dataset_name],
      ["Progress", `step ${job.step} of ${job.steps}`],
      ["Last loss", number(job.loss)],
      ["Attempts", String(job.attempts)],
    ];
    if (job.dataset) rows.splice(3, 0, ["Read", datasetLine(job.dataset)]);
    if (job.validation) rows.push(["Validation", validationSummary(job.validation)]);
    if (job.error) rows.push(["Error", job.error]);
    summary.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-field": k.toLowerCase() }, v)]));
    renderTimeline();
  }

  // queued -> running (-> another attempt ...) (-> cancel_requested) -> how it ended, with times.
  function renderTimeline() {
    const moves = [{ status: "queued", at: job.created_at }];
    if (job.started_at) moves.push({ status: "running", at: job.started_at });
    for (const event of events) {
      if (ATTEMPTS.has(kindOf(event))) {
        moves.push({ status: "running", note: `${kindOf(event)}, attempt ${event.attempt ?? "?"}`, at: event.created_at });
      }
    }
    if (job.status === "cancel_requested") moves.push({ status: "cancel_requested", at: null });
    if (TERMINAL.has(job.status)) moves.push({ status: job.status, at: job.finished_at });
    timeline.replaceChildren(
      ...moves.map((move) => h("li", {}, statusBadge(move.status), move.note ? h("span.muted", {}, move.note) : null, move.at ? when(move.at) : null)),
    );
  }

  function addEvent(event, receivedAt) {
    events.push(event);
    const kind = kindOf(event);
    if (kind === "metrics") {
      charts.loss.add(event.step, event.loss, receivedAt);
      charts.grad_norm.add(event.step, event.grad_norm, receivedAt);
      charts.lr.add(event.step, event.lr, receivedAt);
    }
    if (kind === "validation" && validated) {
      charts.action_mse.add(event.step, event.action_mse, receivedAt, event.blind_mse);
      charts.validation_loss.add(event.step, event.validation_loss, receivedAt);
    }
    const { id: eventId, object, created_at, step, event: _name, kind: _kind, ...details } = event;
    log.append(
      h(
        "tr",
        { "data-event": kind },
        h("td.num", {}, eventId),
        h("td", {}, when(created_at)),
        h("td.num", {}, step),
        h("td", {}, kind),
        h("td.mono", {}, Object.entries(details).map(([k, v]) => `${k}=${typeof v === "number" ? number(v) : JSON.stringify(v)}`).join("  ")),
      ),
    );
    logCount.textContent = `(${events.length})`;
    if (ATTEMPTS.has(kind)) renderTimeline();
    if (kind === "checkpoint" || kind === "finished") refreshFiles();
  }

  async function refresh() {
    try {
      job = await get(`/v1/fine-tunes/${encodeURIComponent(job.id)}`);
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", error.message));
      return;
    }
    render();
  }

  async function refreshFiles() {
    let answer;
    try {
      answer = await get(`/v1/fine-tunes/${encodeURIComponent(job.id)}/files`);
    } catch (error) {
      ctx.failed(error);
      return;
    }
    if (!answer.data.length) {
      files.replaceChildren(h("tr", {}, h("td.muted", { colspan: 4 }, "No files yet: checkpoints appear as they are written, the model when the job completes.")));
      return;
    }
    files.replaceChildren(
      ...answer.data.map((file) =>
        h(
          "tr",
          { "data-file": file.path },
          h("td.mono", {}, file.path),
          h("td.num", { title: `${file.bytes} bytes` }, bytes(file.bytes)),
          h("td.mono", { "data-sha256": "" }, file.sha256 ?? h("span.muted", {}, "given with the download")),
          h("td", {}, h("button", { type: "button", onclick: (event) => fetchFile(file.path, event.target) }, "Download")),
        ),
      ),
    );
  }

  async function fetchFile(path, button) {
    try {
      const sha256 = await download(`/v1/fine-tunes/${encodeURIComponent(job.id)}/files/${path}`, path.split("/").pop());
      // Show the checksum the server sent with the file (where the listing had none to give).
      const cell = button.closest("tr").querySelector("[data-sha256]");
      if (sha256 && cell) cell.textContent = sha256;
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", error.message));
    }
  }

  async function cancelJob() {
    cancel.disabled = true;
    try {
      job = await post(`/v1/fine-tunes/${encodeURIComponent(job.id)}/cancel`);
      messages.replaceChildren(notice("info", job.status === "cancelled" ? "Cancelled." : "Cancel requested: the job stops within a step."));
    } catch (error) {
      if (ctx.failed(error)) return;
      // The API's own words, such as a 409 once the job has already ended.
      messages.replaceChildren(notice("error", `Could not cancel (${error.status}): ${error.message}`));
      await refresh();
    } finally {
      cancel.disabled = false;
    }
    render();
  }

  render();
  refreshFiles();
  ctx.every(POLL_MS, () => {
    if (!TERMINAL.has(job.status)) refresh();
  });
  followEvents(`/v1/fine-tunes/${encodeURIComponent(job.id)}/events?stream=true`, {
    signal: ctx.signal,
    onEvent: (_id, event) => addEvent(event, performance.now()),
  })
    .then(() => {
      if (!ctx.signal.aborted) {
        refresh();
        refreshFiles();
      }
    })
    .catch((error) => {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", `Event stream: ${error.message}`));
    });
}

function configList(job, fields) {
  return h(
    "dl.kv",
    { "data-testid": "config" },
    ...fields.flatMap((field) => {
      const value = job[field];
      const shown = value === null || value === undefined ? "—" : typeof value === "object" ? JSON.stringify(value) : String(value);
      return [h("dt", {}, field), h("dd.mono", { "data-config": field }, shown)];
    }),
  );
}
