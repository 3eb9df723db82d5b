// The form that starts a fine-tune: one input per field of the recipe (from the API's schema),
// and the API's own message next to each field it refuses. A dataset, once entered, is described
// by the API (GET /v1/datasets/{name}): a one-line summary under it, and its cameras offered for
// each model camera, the mapping a job would use preselected.

import { get, post } from "./api.js";
import { h, notice } from "./dom.js";
import { recipeSchema } from "./schema.js";

export async function createView(ctx) {
  const { fields, properties, required, rules } = await recipeSchema();
  // One key per form shown: a double submit (or a retry after a lost answer) starts one job.
  const idempotencyKey = "console-" + Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
  const inputs = {};
  const errors = {};
  const general = h("div");
  const submit = h("button.primary", { type: "submit" }, "Start fine-tune");

  const instead = alternatives(rules);
  const rows = fields.flatMap((field) => {
    const schema = plain(properties[field]);
    const input = inputFor(field, schema, required.includes(field));
    inputs[field] = { input, schema };
    errors[field] = h("div.field-error", { "data-error-for": field, role: "alert" });
    return [
      h("label", { for: `field-${field}` }, field, requiredMark(field, required, instead), h("small", {}, hint(field, schema))),
      h("div", {}, input, errors[field]),
    ];
  });

  const picker = cameraPicker(ctx, inputs, properties, rules);

  const form = h(
    "form.create",
    { novalidate: true, onsubmit: send },
    ...rows,
    h("div.actions", {}, general, submit),
  );
  ctx.root.append(
    h("h1", {}, "New fine-tune"),
    h("p.muted", {}, "Fields left empty take their defaults. The server checks every value and says what it expects."),
    form,
  );

  async function send(event) {
    event.preventDefault();
    general.replaceChildren();
    for (const [field, box] of Object.entries(errors)) {
      box.textContent = "";
      inputs[field].input.classList.remove("invalid");
    }
    const body = {};
    for (const [field, { input, schema }] of Object.entries(inputs)) {
      const value = input.value.trim();
      if (value !== "") body[field] = parse(value, schema);
    }
    const cameras = picker.chosen();
    if (cameras !== null) body.cameras = cameras;
    submit.disabled = true;
    try {
      const job = await post("/v1/fine-tunes", body, { "idempotency-key": idempotencyKey });
      location.hash = `#/jobs/${job.id}`;
    } catch (error) {
      if (ctx.failed(error)) return;
      showProblems(error);
    } finally {
      submit.disabled = false;
    }
  }

  // The API joins the problems it found with "; ", each starting by naming its field.
  function showProblems(error) {
    const unplaced = [];
    for (const part of error.message.split(/; (?=(?:bad|missing|unknown field) [A-Za-z_]+\b)/)) {
      const named = part.match(/^(?:bad|missing|unknown field) ([A-Za-z_]+)/);
      const param = fieldOf(error.param);
      const field = named && errors[named[1]] ? named[1] : part === error.message && errors[param] ? param : null;
      if (field) {
        errors[field].textContent = errors[field].textContent ? `${errors[field].textContent}; ${part}` : part;
        inputs[field].input.classList.add("invalid");
      } else {
        unplaced.push(part);
      }
    }
    if (unplaced.length) general.append(notice("error", unplaced.join("; ")));
    const first = Object.keys(errors).find((field) => errors[field].textContent);
    if (first) inputs[first].input.focus();
  }
}

// The form field an error's param names: its name before any index or key (the API names a place
// inside a list or block, such as datasets[1].weight or integrations[1].wandb.project).
function fieldOf(param) {
  return typeof param === "string" ? param.split(/[[.]/)[0] : null;
}

// The fields that each stand in for another (the schema's rule "anyOf: required a, or required
// b": a recipe names dataset_name or datasets): field -> the fields it may be left for.
function alternatives(rules) {
  const instead = {};
  for (const rule of rules) {
    const choices = Array.isArray(rule.anyOf) && rule.anyOf.every((item) => Array.isArray(item.required) && item.required.length === 1);
    if (!choices) continue;
    const named = rule.anyOf.flatMap((item) => item.required);
    for (const field of named) instead[field] = named.filter((other) => other !== field);
  }
  return instead;
}

// " *" after a required field's name; " * (or datasets)" where another field may take its place.
function requiredMark(field, required, instead) {
  if (required.includes(field)) return " *";
  return instead[field] ? ` * (or ${instead[field].join(", ")})` : null;
}

// The dataset's summary under its field, and a choice of its cameras for each model camera in
// place of the `cameras` text box, while the entered dataset can be described. `chosen()` is the
// mapping to send (null: the text box's, as typed).
function cameraPicker(ctx, inputs, properties, rules) {
  const name = inputs.dataset_name && inputs.dataset_name.input;
  const revision = inputs.dataset_revision && inputs.dataset_revision.input;
  const text = inputs.cameras && inputs.cameras.input;
  if (!name || !text) return { chosen: () => null };
  const modelCameras = (properties.cameras.propertyNames && properties.cameras.propertyNames.enum) || [];
  const info = h("div.dataset-info", { "data-testid": "dataset-info", "aria-live": "polite" });
  const choices = h("div.camera-picker", { "data-testid": "camera-picker", hidden: true });
  name.after(info);
  text.before(choices);
  let shown = null; // the description whose cameras are offered
  let asked = 0;
  let pending = null;
  let timer = null;

  function reset(content) {
    shown = null;
    choices.hidden = true;
    choices.replaceChildren();
    text.hidden = false;
    info.replaceChildren(...(content ? [content] : []));
  }

  async function describe() {
    clearTimeout(timer);
    const dataset = name.value.trim();
    const at = revision ? revision.value.trim() : "";
    if (pending) pending.abort();
    if (!dataset || !camerasApply(rules, inputs.model && inputs.model.input.value)) return reset(null);
    const mine = ++asked;
    pending = new AbortController();
    reset(h("span.muted", {}, `Reading ${dataset}…`)); // the cameras offered were another dataset's
    const query = at ? `?revision=${encodeURIComponent(at)}` : "";
    try {
      const described = await get(`/v1/datasets/${encodeURIComponent(dataset)}${query}`, { signal: pending.signal });
      if (mine === asked) offer(described);
    } catch (error) {
      if (mine !== asked || (error && error.name === "AbortError") || ctx.failed(error)) return;
      const message = h("div.notice.error", { "data-testid": "dataset-error", role: "alert" }, error.message);
      reset(message);
    }
  }

  function offer(described) {
    shown = described;
    const codecs = [...new Set(described.cameras.filter((c) => c.stored === "video").map((c) => c.codec || "?"))];
    const stored = codecs.length ? `video ${codecs.join(", ")}` : "images";
    const read = described.repo ? ` (${described.revision}, commit ${(described.sha || "?").slice(0, 8)})` : "";
    const line = `LeRobot ${described.format}, ${described.episodes.toLocaleString("en-US")} episodes, ` +
      `${described.frames.toLocaleString("en-US")} frames, ${described.fps} fps, ${stored}${read}`;
    info.replaceChildren(h("span.summary", { "data-testid": "dataset-summary" }, line));
    choices.replaceChildren(
      ...modelCameras.map((camera) => {
        const select = h(
          "select",
          { id: `camera-${camera}`, "data-camera": camera },
          h("option", { value: "" }, "none (masked)"),
          ...described.cameras.map((c) =>
            h(
              "option",
              { value: c.feature, selected: described.camera_map[camera] === c.feature },
              `${c.feature} (${c.stored}, ${c.height}x${c.width})`,
            ),
          ),
        );
        return h("label.camera", { for: `camera-${camera}` }, h("span", {}, camera), select);
      }),
    );
    choices.hidden = false;
    text.hidden = true;
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(describe, 600);
  }
  name.addEventListener("input", later);
  name.addEventListener("change", describe);
  if (revision) {
    revision.addEventListener("input", later);
    revision.addEventListener("change", describe);
  }
  if (inputs.model) inputs.model.input.addEventListener("change", describe);
  ctx.onLeave(() => {
    clearTimeout(timer);
    if (pending) pending.abort();
  });

  return {
    chosen() {
      if (!shown || choices.hidden) return null;
      const mapping = {};
      for (const select of choices.querySelectorAll("select[data-camera]")) {
        if (select.value) mapping[select.dataset.camera] = select.value;
      }
      return mapping;
    },
  };
}

// Whether a recipe of `model` takes `cameras`: the schema's rules say which models take none.
function camerasApply(rules, model) {
  if (!model) return true;
  return !rules.some((rule) => {
    const models = rule.if && rule.if.properties && rule.if.properties.model && rule.if.properties.model.enum;
    const cameras = rule.then && rule.then.properties && rule.then.properties.cameras;
    return models && models.includes(model) && cameras && cameras.type === "null";
  });
}

// The schema of a field that may also be null: the non-null branch.
function plain(schema) {
  if (schema.anyOf) {
    const branch = schema.anyOf.find((item) => item.type !== "null") || {};
    return { ...branch, description: schema.description, default: schema.default, title: schema.title, "x-model-defaults": schema["x-model-defaults"] };
  }
  return schema;
}

// "lora (pi05-tiny: full)": the spec's default, then each model's own (the schema's x-model-defaults).
function defaultText(schema) {
  const own = Object.entries(schema["x-model-defaults"] || {}).map(([model, value]) => `${model}: ${value}`);
  return own.length ? `${schema.default} (${own.join("; ")})` : String(schema.default);
}

// What a list field's JSON looks like, shown in its empty box.
const LIST_EXAMPLES = {
  integrations: '[{"type": "tensorboard"}, {"type": "wandb", "wandb": {"project": "pick"}}, {"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example"}}]',
  datasets: '[{"name": "team/pick-fork", "weight": 3}, {"name": "lerobot/aloha_pick", "cameras": {"base_0_rgb": "observation.images.top"}}]',
};

function inputFor(field, schema, required) {
  const common = { id: `field-${field}`, name: field };
  if (schema.enum) {
    // A field whose default depends on the model offers "default", sending nothing, so the API fills it in.
    const byModel = schema["x-model-defaults"] !== undefined;
    const options = schema.enum.map((choice) => h("option", { value: choice, selected: !byModel && choice === schema.default }, choice));
    const first = required ? h("option", { value: "" }, "choose…") : byModel ? h("option", { value: "" }, `default: ${defaultText(schema)}`) : null;
    return h("select", common, first, ...options);
  }
  if (isObject(schema)) {
    const example = field === "eval" ? '{"env": "relay/Dot-v0", "episodes": 10}' : '{"base_0_rgb": "observation.images.top"}';
    return h("textarea", { ...common, placeholder: example });
  }
  if (isListOfObjects(schema)) {
    // integrations or a mixture's datasets: the list as JSON, as the API takes it.
    return h("textarea", { ...common, placeholder: LIST_EXAMPLES[field] || "[{...}, {...}]" });
  }
  const placeholder =
    schema.type === "array" ? "comma-separated (default: the method's)" : schema.default !== undefined && schema.default !== null ? defaultText(schema) : "";
  return h("input", { ...common, type: "text", placeholder, inputmode: schema.type === "integer" || schema.type === "number" ? "decimal" : null });
}

// An object field: a map (cameras) or a block of its own (eval, a $ref to its schema).
function isObject(schema) {
  return schema.type === "object" || schema.$ref !== undefined;
}

// A list whose items are blocks of their own (integrations: a union of object schemas).
function isListOfObjects(schema) {
  const items = schema.type === "array" ? schema.items || {} : {};
  return items.oneOf !== undefined || items.anyOf !== undefined || items.$ref !== undefined || items.type === "object";
}

function hint(field, schema) {
  return schema.description || "";
}

// A typed value where the text reads as one; otherwise the text itself, for the API to refuse
// in its own words.
function parse(text, schema) {
  if (schema.type === "integer" || schema.type === "number") {
    const value = Number(text);
    return Number.isNaN(value) ? text : value;
  }
  if (schema.type === "array" && !isListOfObjects(schema)) return text.split(",").map((item) => item.trim()).filter(Boolean);
  if (isObject(schema) || isListOfObjects(schema)) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return text;
}
