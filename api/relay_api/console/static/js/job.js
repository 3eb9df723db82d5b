// A fine-tune's page: its status and how it got there, its results card (the API's summary of the
// job: pace, ETA, losses, checkpoints, validation and evaluation, how to use the model), live
// charts of loss, grad_norm and learning rate fed by the API's event stream (and, for a job with a
// validation split, its held-out action error against the blind baseline and its validation loss),
// the event log (newest first), its config, its files, Cancel.

import { APIError, download, fileURL, followEvents, get, post } from "./api.js";
import { LiveChart } from "./charts.js";
import { bytes, h, notFound, notice, number, statusBadge, when } from "./dom.js";
import { recipeSchema } from "./schema.js";
import { checkpointLine, checkpointsTable, headlineActionError, resultsFigures, useThisModel } from "./results.js";
import { deployButton } from "./deployments.js";

const TERMINAL = new Set(["completed", "cancelled", "error"]);
const POLL_MS = 2000;
// The summary reads every event of the job: asked for less often than the job itself, and for a
// job of many events (a 10,000-event job's takes about a quarter of a second) at most a twentieth
// of the time, so an open page costs the API at most 5% of a core.
const SUMMARY_MS = 4000;
const SUMMARY_SHARE = 20;
// The event log shows the newest this many until "Show all" is pressed.
const LOG_ROWS = 50;
// Events that start another attempt of a job, shown in its timeline.
const ATTEMPTS = new Set(["retry", "resumed"]);

// What the engine read, in one line, as relay.events.dataset_line writes it: "lerobot/pusht_image at
// v2.1 (commit 1a2b3c4d), LeRobot v2.1, 206 episodes, 25,650 frames"; a mixture's first dataset
// then "... (75% of samples), mixed with 1 more dataset".
function datasetLine(read) {
  const where = read.repo ? `${read.repo} at ${read.revision} (commit ${String(read.sha ?? "?").slice(0, 8)})` : String(read.path);
  const version = read.format ? `LeRobot ${read.format}` : "no codebase_version";
  const count = (n) => Number(n ?? 0).toLocaleString("en-US");
  let line = `${where}, ${version}, ${count(read.episodes)} episodes, ${count(read.frames)} frames`;
  const mixture = read.mixture;
  if (Array.isArray(mixture) && mixture.length) {
    line += sharePart(mixture[0].share);
    const others = mixture.length - 1;
    line += `, mixed with ${others} more dataset${others === 1 ? "" : "s"}`;
  }
  return line;
}

// " (75% of samples)", as dataset_line adds it; nothing where the share is not a number.
function sharePart(share) {
  return typeof share === "number" ? ` (${percentText(share)} of samples)` : "";
}

// A fraction as a whole percent the way Python's "{:.0%}" writes it: halves to the even number.
function percentText(share) {
  const scaled = share * 100;
  let whole = Math.round(scaled);
  if (whole - scaled === 0.5 && whole % 2 !== 0) whole -= 1;
  return `${whole}%`;
}

// A mixture's datasets as the recipe gave them, one item each: "team/pick at v2.1: weight 3, 75%
// of samples, cameras base_0_rgb = observation.images.top". Each share is its weight over the sum.
function mixtureList(datasets) {
  const total = datasets.reduce((sum, item) => sum + Number(item.weight ?? 1), 0);
  return h(
    "ul.mixture",
    { "data-testid": "mixture" },
    ...datasets.map((item, index) => {
      const weight = Number(item.weight ?? 1);
      const parts = [`weight ${number(weight)}`, `${percentText(weight / total)} of samples`];
      if (item.cameras && Object.keys(item.cameras).length) {
        parts.push(`cameras ${Object.entries(item.cameras).map(([camera, feature]) => `${camera} = ${feature}`).join(", ")}`);
      }
      const name = item.revision ? `${item.name} at ${item.revision}` : item.name;
      return h("li", { "data-mixture": String(index) }, h("span.mono", {}, name), `: ${parts.join(", ")}`);
    }),
  );
}

// What the engine read of each dataset of a mixture, a dataset_line each with its share; the
// whole in one line (as the CLI prints it) on hover.
function mixtureReadList(read) {
  return h(
    "ul.mixture",
    { "data-testid": "mixture-read", title: datasetLine(read) },
    ...read.mixture.map((part, index) => h("li", { "data-read": String(index) }, datasetLine(part) + sharePart(part.share))),
  );
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
  const facts = h("dl.kv");
  const timeline = h("ol.timeline", { "data-testid": "timeline" });
  const results = h("div.card.results", { "data-testid": "results" }, h("p.muted", {}, "Loading…"));
  const checkpoints = h("div", { "data-testid": "checkpoints" });
  const use = h("div.use", { "data-testid": "use" });
  // A job with an eval block: its success rate over checkpoints, and each evaluation's videos.
  const evaluated = job.eval !== null && job.eval !== undefined;
  const evaluations = h("div", { "data-testid": "evaluations" });
  // A job with a validation split: its held-out curves beside the training loss.
  const validated = job.validation_episodes !== null && job.validation_episodes !== undefined;
  const charts = {
    loss: new LiveChart("loss", "loss", "#1f4e79", job.steps),
    ...(validated
      ? {
          // The headline: the error of the mean of the chunks sampled per frame (one chunk's, for
          // scorings from before it), against the blind baseline's, which samples nothing.
          action_error: new LiveChart("action_error", "held-out action error", "#6941c6", job.steps, { title: "blind baseline", color: "#98a2b3" }),
          validation_loss: new LiveChart("validation_loss", "validation loss", "#c11574", job.steps),
        }
      : {}),
    ...(evaluated ? { success_rate: new LiveChart("success_rate", "closed-loop success rate", "#0e9384", job.steps) } : {}),
    grad_norm: new LiveChart("grad_norm", "grad_norm", "#b54708", job.steps),
    lr: new LiveChart("lr", "learning rate", "#067647", job.steps),
  };
  ctx.onLeave(() => Object.values(charts).forEach((chart) => chart.destroy()));
  const log = h("tbody");
  const logCount = h("span.muted");
  const showAll = h("button.link", { type: "button", "data-testid": "show-all", hidden: true, onclick: toggleLog });
  const files = h("tbody");
  const events = [];
  let card = null; // the API's summary of the job (GET /v1/fine-tunes/{id}/summary)
  let fileList = [];
  let logExpanded = false;
  const cancel = h("button.danger", { type: "button", onclick: cancelJob }, "Cancel");

  // Node.append writes a null as the text "null": the sections a job does not have are left out.
  ctx.root.append(
    ...[
      title,
      messages,
      h("div.card", {}, facts, h("h2", {}, "Status"), timeline),
      h("h2", {}, "Results"),
      results,
      checkpoints,
      h("h2", {}, "Training"),
      h("div.grid", {}, ...Object.values(charts).map((chart) => chart.node)),
      evaluated ? h("h2", {}, "Closed-loop evaluation") : null,
      evaluated ? evaluations : null,
      h("h2", {}, "Events ", logCount, " ", showAll),
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
      h("h2", {}, "Use this model"),
      use,
    ].filter((section) => section !== null),
  );

  function render() {
    title.replaceChildren(`Fine-tune ${job.id}`, statusBadge(job.status));
    if (!TERMINAL.has(job.status) && job.status !== "cancel_requested") title.append(cancel);
    const rows = [
      ["Name", job.name ?? "—"],
      ["Model", job.model],
      ["Dataset", Array.isArray(job.datasets) && job.datasets.length ? mixtureList(job.datasets) : job.dataset_name],
      ["Progress", `step ${job.step} of ${job.steps}`],
      ["Last loss", number(job.loss)],
      ["Attempts", String(job.attempts)],
    ];
    if (job.dataset) rows.splice(3, 0, ["Read", readValue(job.dataset)]);
    if (job.weights) rows.splice(2, 0, ["Weights", weightsLine(job.weights)]);
    if (job.error) rows.push(["Error", job.error]);
    facts.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-field": k.toLowerCase() }, v)]));
    renderTimeline();
  }

  // One dataset's line; a mixture's, each of its datasets' (the first's line alone names one).
  function readValue(read) {
    return Array.isArray(read.mixture) && read.mixture.length ? mixtureReadList(read) : datasetLine(read);
  }

  // Where the starting weights came from, as relay.events.weights_line says it.
  function weightsLine(read) {
    let where = read.path;
    if (read.job) where = `fine-tune ${read.job}`;
    else if (read.repo) where = `${read.repo} at ${read.revision ?? "the default branch"} (commit ${String(read.sha ?? "?").slice(0, 8)})`;
    return `${read.model} weights of ${where}`;
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
      charts.action_error.add(event.step, headlineActionError(event), receivedAt, event.blind_mse);
      charts.validation_loss.add(event.step, event.validation_loss, receivedAt);
    }
    if (kind === "eval" && evaluated) {
      charts.success_rate.add(event.step, event.success_rate, receivedAt);
      evaluations.append(evaluationBlock(event));
    }
    // Newest first: the new row goes on top, and the oldest shown leaves unless all are shown.
    log.prepend(eventRow(event));
    if (!logExpanded && log.children.length > LOG_ROWS) log.lastElementChild.remove();
    renderLogCount();
    if (ATTEMPTS.has(kind)) renderTimeline();
    if (kind === "checkpoint" || kind === "finished") filesAndSummarySoon();
  }

  // Once per burst: an old job's stream brings all its checkpoints at once.
  let pending = null;
  function filesAndSummarySoon() {
    if (pending !== null) return;
    pending = setTimeout(() => {
      pending = null;
      if (ctx.signal.aborted) return;
      refreshFiles();
      refreshSummary();
    }, 300);
  }

  function eventRow(event) {
    const kind = kindOf(event);
    const { id: eventId, object, created_at, step, event: _name, kind: _kind, ...details } = event;
    return h(
      "tr",
      { "data-event": kind },
      h("td.num", {}, eventId),
      h("td", {}, when(created_at)),
      h("td.num", {}, step),
      h("td", {}, kind),
      h("td.mono", {}, kind === "stage" ? stageText(details) : Object.entries(details).map(([k, v]) => `${k}=${typeof v === "number" ? number(v) : JSON.stringify(v)}`).join("  ")),
    );
  }

  // A stage event in words, as relay.events.stage_text writes it: "writing the output",
  // "evaluating relay/Dot-v0 (10 episodes)".
  function stageText({ stage, detail }) {
    const words = stage === "writing" ? "writing the output" : stage;
    return detail ? `${words} ${detail}` : words;
  }

  function renderLogCount() {
    const shown = log.children.length;
    logCount.textContent = shown < events.length ? `(newest ${shown} of ${events.length})` : `(${events.length})`;
    showAll.hidden = events.length <= LOG_ROWS;
    showAll.textContent = logExpanded ? "Show the newest only" : `Show all ${events.length}`;
  }

  // The whole log, or back to the newest LOG_ROWS.
  function toggleLog() {
    logExpanded = !logExpanded;
    const shown = logExpanded ? events : events.slice(-LOG_ROWS);
    log.replaceChildren(...shown.map(eventRow).reverse());
    renderLogCount();
  }

  let summaryTook = 0;
  async function refreshSummary() {
    const started = performance.now();
    try {
      card = await get(`/v1/fine-tunes/${encodeURIComponent(job.id)}/summary`);
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", error.message));
      return;
    } finally {
      summaryTook = performance.now() - started;
    }
    renderCard();
  }

  // While the job has not ended: the card again after SUMMARY_MS, or SUMMARY_SHARE times as long
  // as the last answer took.
  function pollSummary() {
    const wait = Math.max(SUMMARY_MS, SUMMARY_SHARE * summaryTook);
    setTimeout(async () => {
      if (ctx.signal.aborted) return; // the page was left
      if (!TERMINAL.has(job.status)) await refreshSummary();
      if (!TERMINAL.has(job.status)) pollSummary();
    }, wait);
  }

  function renderCard() {
    results.replaceChildren(resultsFigures(card));
    checkpoints.replaceChildren(...checkpointsTable(card));
    use.replaceChildren(...useThisModel(card.use));
    if (job.status === "completed") use.append(deployButton(ctx, job.id, messages));
    for (const chart of Object.values(charts)) chart.explain(card.metrics_note);
    renderFiles();
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
    fileList = answer.data;
    renderFiles();
  }

  // The files, each checkpoint's under a row with the figures at its step (from the summary).
  function renderFiles() {
    if (!fileList.length) {
      files.replaceChildren(h("tr", {}, h("td.muted", { colspan: 4 }, "No files yet: checkpoints appear as they are written, the model when the job completes.")));
      return;
    }
    const rows = [];
    let group = null;
    for (const file of fileList) {
      const folder = file.path.split("/").slice(0, file.path.startsWith("checkpoints/") ? 2 : 1).join("/");
      if (folder !== group) {
        group = folder;
        rows.push(groupRow(folder));
      }
      rows.push(
        h(
          "tr",
          { "data-file": file.path },
          h("td.mono", {}, file.path),
          h("td.num", { title: `${file.bytes} bytes` }, bytes(file.bytes)),
          h("td.mono", { "data-sha256": "" }, file.sha256 ?? h("span.muted", {}, "given with the download")),
          h("td", {}, h("button", { type: "button", onclick: (event) => fetchFile(file.path, event.target) }, "Download")),
        ),
      );
    }
    files.replaceChildren(...rows);
  }

  function groupRow(folder) {
    let text = "";
    if (folder === "output") {
      text = "the model, merged: trained " + (card ? `${card.step} steps` : `${job.step} steps`);
      if (card && card.loss.last) text += `, last loss ${number(card.loss.last.loss)}`;
    } else {
      const checkpoint = card ? card.checkpoints.find((c) => c.path === folder) : null;
      text = checkpoint ? checkpointLine(checkpoint) : "";
    }
    return h("tr.group", { "data-folder": folder }, h("td", { colspan: 4 }, h("span.mono", {}, `${folder}/`), text ? h("span.muted", {}, `  ${text}`) : null));
  }

  // One evaluation: its figures (as relay.events.eval_line writes them) and its videos, played in
  // the page from the job's files.
  function evaluationBlock(event) {
    const rate = event.success_rate === null ? "—" : `${Math.round(event.success_rate * 100)}%`;
    const line = `step ${event.step}: ${event.env}: success ${rate} of ${event.episodes} episodes, mean reward ${number(event.mean_reward)}, mean length ${number(event.mean_length)} steps (${number(event.seconds)} s)`;
    const videos = (event.videos || []).map((path) => {
      // preload "auto" and a seek to the first frame: with metadata alone Chromium paints nothing
      // (a black box) until the video is played.
      const video = h("video", { controls: true, muted: true, loop: true, preload: "auto", width: 192, "data-video": path, title: path });
      video.addEventListener("loadedmetadata", () => {
        if (video.paused && video.currentTime === 0) video.currentTime = 0.001;
      }, { once: true });
      fileURL(`/v1/fine-tunes/${encodeURIComponent(job.id)}/files/${path}`)
        .then((url) => {
          video.src = url;
          ctx.onLeave(() => URL.revokeObjectURL(url));
        })
        .catch((error) => ctx.failed(error));
      return video;
    });
    return h("div.card", { "data-evaluation": String(event.step) }, h("div", {}, line), h("div.videos", {}, ...videos));
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
  refreshSummary();
  ctx.every(POLL_MS, () => {
    if (!TERMINAL.has(job.status)) refresh();
  });
  pollSummary();
  followEvents(`/v1/fine-tunes/${encodeURIComponent(job.id)}/events?stream=true`, {
    signal: ctx.signal,
    onEvent: (_id, event) => addEvent(event, performance.now()),
  })
    .then(() => {
      if (!ctx.signal.aborted) {
        refresh();
        refreshFiles();
        refreshSummary();
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
      const shown =
        field === "integrations"
          ? integrationsText(value)
          : value === null || value === undefined
            ? "—"
            : typeof value === "object"
              ? JSON.stringify(value)
              : String(value);
      return [h("dt", {}, field), h("dd.mono", { "data-config": field }, shown)];
    }),
  );
}

// A job's experiment trackers (docs/integrations.md), one phrase each: "wandb: team/pick (run
// "x", tags a, b); tensorboard: event files under tensorboard/ among the files; mlflow: pick at
// https://mlflow.example".
function integrationsText(list) {
  if (!Array.isArray(list) || list.length === 0) return "—";
  return list
    .map((item) => {
      if (item.type === "wandb" && item.wandb) {
        const where = (item.wandb.entity ? `${item.wandb.entity}/` : "") + item.wandb.project;
        const details = [item.wandb.name ? `run "${item.wandb.name}"` : null, item.wandb.tags && item.wandb.tags.length ? `tags ${item.wandb.tags.join(", ")}` : null].filter(Boolean);
        return `wandb: ${where}` + (details.length ? ` (${details.join(", ")})` : "");
      }
      if (item.type === "tensorboard") return "tensorboard: event files under tensorboard/ among the files";
      if (item.type === "mlflow" && item.mlflow) return `mlflow: ${item.mlflow.experiment || "relay"} at ${item.mlflow.tracking_uri}`;
      return JSON.stringify(item);
    })
    .join("; ");
}
