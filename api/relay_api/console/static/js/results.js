// A job's results card on its page, drawn from the API's summary of the job
// (GET /v1/fine-tunes/{id}/summary, relay.sft.summary.FineTuneSummary): the same figures as
// `relay fine-tunes retrieve` prints, computed once by the API.

import { duration, h, number } from "./dom.js";

// The card's figures: progress, time (elapsed and ETA while running, duration once ended), pace,
// the training loss, validation and closed-loop results once reported, or why there are none yet.
export function resultsFigures(card) {
  const rows = [["Progress", "progress", `${card.step} / ${card.steps} steps (${Math.round(card.progress * 100)}%)`]];
  const queued = card.queued_seconds === null ? "" : ` (queued ${duration(card.queued_seconds)} before)`;
  if (card.duration_seconds !== null) rows.push(["Duration", "duration", duration(card.duration_seconds) + queued]);
  else if (card.elapsed_seconds !== null) rows.push(["Elapsed", "elapsed", duration(card.elapsed_seconds) + queued]);
  else if (card.queued_seconds !== null) rows.push(["Queued", "queued", duration(card.queued_seconds)]);
  if (card.eta_seconds !== null) {
    rows.push(["ETA", "eta", `${duration(card.eta_seconds)} left at ${number(card.latest_steps_per_second, 3)} steps/s (the latest metrics window)`]);
  }
  if (card.steps_per_second !== null) {
    rows.push(["Pace", "pace", `${number(card.steps_per_second, 3)} steps/s, ${number(card.samples_per_second, 3)} samples/s (the whole run)`]);
  }
  const loss = card.loss;
  if (loss.first && loss.last && loss.best) {
    const at = (name, point) => `${name} ${number(point.loss)} (step ${point.step})`;
    rows.push(["Training loss", "loss", [at("first", loss.first), at("last", loss.last), at("best", loss.best)].join(", ")]);
  }
  if (card.validation) rows.push(["Validation", "validation", validationLines(card.validation)]);
  if (card.eval) rows.push(["Closed loop", "eval", evalText(card.eval)]);
  if (card.pushed) rows.push(["Hub", "pushed", pushedLine(card.pushed)]);
  const list = h("dl.kv", {}, ...rows.flatMap(([label, field, value]) => [h("dt", {}, label), h("dd", { "data-result": field }, value)]));
  return card.metrics_note ? h("div", {}, list, h("p.muted", { "data-result": "note" }, capitalized(card.metrics_note))) : list;
}

// Where a recipe's hub block pushed the output, as relay.events.PushedEvent.describe says it.
function pushedLine(pushed) {
  if (pushed.error !== null && pushed.error !== undefined) {
    return `not pushed to ${pushed.repo_id} at ${pushed.revision}: ${pushed.error} (the job's output is kept)`;
  }
  return `pushed to ${pushed.repo_id} at ${pushed.revision}, commit ${String(pushed.commit).slice(0, 8)}: ${pushed.url}`;
}

// A scoring's headline action error, as relay.events.headline_action_error reads it: the error of
// the mean of the chunks sampled per frame; a scoring from before it was reported has one chunk's
// error alone, which stands in.
export function headlineActionError(scores) {
  return scores.mean_action_mse ?? scores.action_mse ?? null;
}

// One scoring of the validation split, as relay.events.validation_line writes it: "action error
// 0.01 (mean of 4 chunks) vs blind 0.0281 (2.81x better), one chunk 0.0123, spread 0.0023,
// validation loss 0.104, 48 frames of 4 episodes"; one from before the mean of chunks: "action
// error 0.0123 (one chunk) vs blind ...".
function validationLine(scores) {
  const headline = headlineActionError(scores);
  const withMean = scores.mean_action_mse !== null && scores.mean_action_mse !== undefined;
  const chunks = scores.chunks ?? null;
  const what = !withMean ? "one chunk" : chunks === null ? "mean of chunks" : `mean of ${chunks} chunk${chunks === 1 ? "" : "s"}`;
  const action = `action error ${number(headline)} (${what})${versusBlind(headline, scores.blind_mse)}`;
  const parts = [action];
  if (withMean) parts.push(`one chunk ${number(scores.action_mse)}`, `spread ${number(scores.action_spread)}`);
  parts.push(`validation loss ${number(scores.validation_loss)}`, framesOf(scores));
  return parts.join(", ");
}

// " vs blind 0.0281 (2.81x better)": the blind baseline's error, and how the headline compares.
function versusBlind(headline, blind) {
  if (blind === null || blind === undefined) return "";
  let text = ` vs blind ${number(blind)}`;
  if (headline > 0) {
    const ratio = blind / headline;
    text += ratio >= 1 ? ` (${ratio.toFixed(2)}x better)` : ` (${(1 / ratio).toFixed(2)}x worse)`;
  }
  return text;
}

// "48 frames of 4 episodes"
function framesOf(scores) {
  const count = (n) => Number(n ?? 0).toLocaleString("en-US");
  return `${count(scores.frames)} frames of ${count(scores.episodes)} episode${scores.episodes === 1 ? "" : "s"}`;
}

// One dataset of a mixture's scoring, its headline figures: "lerobot/aloha_pick: action error
// 0.012 vs blind 0.03 (2.50x better), 24 frames of 1 episode".
function datasetValidationLine(scores) {
  const headline = headlineActionError(scores);
  return `${scores.dataset}: action error ${number(headline)}${versusBlind(headline, scores.blind_mse)}, ${framesOf(scores)}`;
}

// The job's validation block (best and last), a line each, as `relay fine-tunes retrieve` prints it;
// a mixture's, each dataset's figures under its line.
function validationLines(block) {
  const lines = scoringLines("best", block.best);
  if (block.last.step !== block.best.step) lines.push(...scoringLines("last", block.last));
  return lines;
}

function scoringLines(which, scores) {
  const lines = [h("div", { "data-validation": which }, `${which} at step ${scores.step}: ${validationLine(scores)}`)];
  if (Array.isArray(scores.datasets) && scores.datasets.length) {
    lines.push(
      h(
        "ul.per-dataset",
        { "data-validation-datasets": which },
        ...scores.datasets.map((part) => h("li", { "data-dataset": String(part.dataset) }, datasetValidationLine(part))),
      ),
    );
  }
  return lines;
}

// "success 55% at step 2000 (best 60% at step 1000)"
function evalText(evaluation) {
  const rate = (figures) => `${figures.success_rate === null ? "—" : percent(figures.success_rate)} at step ${figures.step}`;
  let text = evaluation.last ? `success ${rate(evaluation.last)}` : "success —";
  if (evaluation.best && evaluation.last && evaluation.best.step !== evaluation.last.step) text += ` (best ${rate(evaluation.best)})`;
  return text;
}

// A checkpoint's figures in one line, beside its files: "step 20 · loss 0.5 · ...".
export function checkpointLine(c) {
  const parts = [`step ${c.step}`, `loss ${number(c.loss)}`, `grad_norm ${number(c.grad_norm)}`, `lr ${number(c.lr)}`];
  if (c.seconds !== null && c.seconds !== undefined) parts.push(`written in ${number(c.seconds, 3)} s`);
  if (c.validation) parts.push(`validation action error ${number(headlineActionError(c.validation))}`);
  if (c.eval && c.eval.success_rate !== null) parts.push(`success ${percent(c.eval.success_rate)}`);
  return parts.join(" · ");
}

// "Use this model": the commands and code with the job's id in them, ready to copy.
export function useThisModel(use) {
  const block = (name, label, text) => [h("h3", {}, label), h("pre.code", { "data-use": name }, text)];
  return [
    use.note ? h("p.muted", { "data-use": "note" }, capitalized(use.note) + ".") : null,
    ...block("download", "Download (shell)", use.download),
    ...block("python", "Python: download, and load with Relay's engine", use.python),
    ...(use.lerobot ? block("lerobot", "lerobot: PI05Policy", use.lerobot) : [h("h3", {}, "lerobot"), h("p.muted", { "data-use": "lerobot" }, `${use.lerobot_note}.`)]),
    h("h3", {}, "Deploy"),
    h("p", { "data-use": "deploy" }, ...withCode(use.deploy)),
  ].filter((node) => node !== null);
}

// The API writes commands in prose between backticks (Markdown's code spans): shown as code.
export function withCode(text) {
  return text.split("`").map((part, index) => (index % 2 ? h("code", {}, part) : part)).filter((part) => part !== "");
}

function capitalized(text) {
  return text ? text[0].toUpperCase() + text.slice(1) : text;
}

function percent(share) {
  return `${Math.round(share * 100)}%`;
}

// Every checkpoint, pruned ones too, with the figures at its step.
export function checkpointsTable(card) {
  if (!card.checkpoints.length) return [];
  const withValidation = card.checkpoints.some((c) => c.validation);
  const withEval = card.checkpoints.some((c) => c.eval);
  const head = ["Step", "Loss", "grad_norm", "Learning rate", "Written in"];
  if (withValidation) head.push("Validation action error");
  if (withEval) head.push("Success rate");
  head.push("Files");
  return [
    h("h3", {}, "Checkpoints ", h("span.muted", {}, "(a job keeps its newest two)")),
    h(
      "table",
      { "data-testid": "checkpoint-figures" },
      h("thead", {}, h("tr", {}, ...head.map((name, i) => h(i < head.length - 1 ? "th.num" : "th", {}, name)))),
      h(
        "tbody",
        {},
        ...card.checkpoints.map((c) =>
          h(
            "tr",
            { "data-checkpoint": c.step },
            h("td.num", {}, c.step),
            h("td.num", { "data-figure": "loss" }, number(c.loss)),
            h("td.num", {}, number(c.grad_norm)),
            h("td.num", {}, number(c.lr)),
            h("td.num", {}, c.seconds === null || c.seconds === undefined ? "—" : `${number(c.seconds, 3)} s`),
            withValidation ? h("td.num", { "data-figure": "validation" }, c.validation ? number(headlineActionError(c.validation)) : "—") : null,
            withEval ? h("td.num", { "data-figure": "success" }, c.eval && c.eval.success_rate !== null ? percent(c.eval.success_rate) : "—") : null,
            h("td", {}, c.kept ? h("span.mono", {}, `${c.path}/`) : h("span.muted", {}, "pruned")),
          ),
        ),
      ),
    ),
  ];
}
