// Training-loop sessions: a table (newest first, cursor paging, refreshing itself) and a page
// per session with its settings, where it runs, and Close.

import { APIError, get, post } from "./api.js";
import { bytes, h, notFound, notice, statusBadge, when } from "./dom.js";

const PAGE = 20;
const REFRESH_MS = 3000;
const ENDED = new Set(["closed", "error"]);
// What a session's worker counted: calls run, optimizer steps, states saved.
const COUNTS = [
  ["calls", "Calls"],
  ["steps", "Optimizer steps"],
  ["saved_states", "Saved states"],
];

export async function sessionsView(ctx) {
  const cursors = [null];
  let page = 0;
  const body = h("tbody");
  const problem = h("div");
  const previous = h("button", { type: "button", disabled: true, onclick: () => show(page - 1) }, "← Newer");
  const next = h("button", { type: "button", disabled: true, onclick: () => show(page + 1) }, "Older →");
  ctx.root.append(
    h("h1", {}, "Training sessions"),
    h("p.muted", {}, "Sessions are started from Python (relay.training); here you can watch and close them."),
    problem,
    h(
      "table",
      { "data-testid": "sessions" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", {}, "ID"),
          h("th", {}, "Status"),
          h("th", {}, "Model"),
          h("th", {}, "Method"),
          h("th.num", {}, "Calls"),
          h("th.num", {}, "Steps"),
          h("th.num", {}, "Saved states"),
          h("th", {}, "Created"),
          h("th", {}, "Ended"),
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
      answer = await get(`/v1/sessions?limit=${PAGE}` + (after ? `&after=${encodeURIComponent(after)}` : ""));
    } catch (error) {
      if (!ctx.failed(error)) problem.replaceChildren(notice("error", error.message));
      return;
    }
    if (ctx.signal.aborted) return;
    problem.replaceChildren();
    page = index;
    if (answer.data.length) cursors[index + 1] = answer.data[answer.data.length - 1].id;
    body.replaceChildren(
      ...answer.data.map((s) =>
        h(
          "tr",
          { "data-session": s.id },
          h("td.mono", {}, h("a", { href: `#/sessions/${s.id}` }, s.id)),
          h("td", {}, statusBadge(s.status)),
          h("td", {}, s.base_model),
          h("td", {}, `${s.finetune}${s.finetune === "lora" ? ` r${s.lora_rank}` : ""}`),
          h("td.num", {}, s.calls),
          h("td.num", {}, s.steps),
          h("td.num", {}, s.saved_states),
          h("td", {}, when(s.created_at)),
          h("td", {}, when(s.ended_at)),
        ),
      ),
    );
    if (!answer.data.length) body.append(h("tr", {}, h("td.muted", { colspan: 9 }, "No sessions.")));
    previous.disabled = page === 0;
    next.disabled = !answer.has_more;
  }

  await show(0);
  ctx.every(REFRESH_MS, () => show(page));
}

export async function sessionView(ctx, id) {
  let session;
  try {
    session = await get(`/v1/sessions/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error instanceof APIError && error.status === 404) {
      ctx.root.append(notFound(error.message));
      return;
    }
    throw error;
  }
  const title = h("h1");
  const messages = h("div", { "data-testid": "messages" });
  const details = h("dl.kv", { "data-testid": "session" });
  const close = h("button.danger", { type: "button", onclick: closeSession }, "Close");
  const states = h("tbody");
  ctx.root.append(
    title,
    messages,
    h("div.card", {}, details),
    h("h2", {}, "Your saved states"),
    h("p.muted", {}, "States belong to you, not to one session: any session of the same model and targets can load_state them."),
    h(
      "table",
      { "data-testid": "states" },
      h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Model"), h("th", {}, "Method"), h("th.num", {}, "Size"), h("th", {}, "Saved"))),
      states,
    ),
  );

  async function showStates() {
    let answer;
    try {
      answer = await get("/v1/states");
    } catch (error) {
      ctx.failed(error);
      return;
    }
    states.replaceChildren(
      ...answer.data.map((state) =>
        h(
          "tr",
          { "data-state": state.name },
          h("td.mono", {}, state.name),
          h("td", {}, state.base_model ?? "—"),
          h("td", {}, state.finetune ?? "—"),
          h("td.num", {}, bytes(state.bytes)),
          h("td", {}, when(state.saved_at ?? state.created_at ?? null)),
        ),
      ),
    );
    if (!answer.data.length) states.append(h("tr", {}, h("td.muted", { colspan: 5 }, "None saved yet (save_state in a session).")));
  }

  function render() {
    title.replaceChildren(`Session ${session.id}`, statusBadge(session.status));
    if (!ENDED.has(session.status)) title.append(close);
    const rows = [
      ["Status", session.status],
      ["Model", session.base_model],
      ["Method", session.finetune],
      ["Rank / alpha", `${session.lora_rank} / ${session.lora_alpha ?? session.lora_rank}`],
      ["Targets", (session.targets || []).join(", ")],
      ["Action horizon", String(session.action_horizon)],
      ...COUNTS.map(([field, label]) => [label, String(session[field] ?? 0)]),
      ["Worker", session.worker ?? "—"],
      ["Idle timeout", `${session.idle_timeout_seconds} s`],
      ["Created", when(session.created_at)],
      ["Ready", when(session.ready_at)],
      ["Ended", when(session.ended_at)],
    ];
    if (session.info) rows.push(["Model info", h("span.mono", {}, JSON.stringify(session.info))]);
    if (session.error) rows.push([session.status === "error" ? "Error" : "Why it ended", session.error]);
    details.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  async function refresh() {
    try {
      session = await get(`/v1/sessions/${encodeURIComponent(session.id)}`);
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", error.message));
      return;
    }
    render();
  }

  async function closeSession() {
    close.disabled = true;
    try {
      session = await post(`/v1/sessions/${encodeURIComponent(session.id)}/close`);
      messages.replaceChildren(notice("info", ENDED.has(session.status) ? "Closed." : "Closing: the calls already sent run first."));
    } catch (error) {
      if (!ctx.failed(error)) messages.replaceChildren(notice("error", `Could not close (${error.status}): ${error.message}`));
    } finally {
      close.disabled = false;
    }
    render();
  }

  render();
  showStates();
  ctx.every(REFRESH_MS, () => {
    if (!ENDED.has(session.status)) {
      refresh();
      showStates();
    }
  });
}
