// The fine-tunes table: newest first, a page at a time with the API's cursor, refreshed every
// few seconds while it is on screen.

import { get } from "./api.js";
import { h, notice, number, statusBadge, when } from "./dom.js";

const PAGE = 20;
const REFRESH_MS = 3000;

export async function jobsView(ctx) {
  // cursors[i] is the `after` of page i (null for the first page).
  const cursors = [null];
  let page = 0;
  const body = h("tbody");
  const problem = h("div");
  const previous = h("button", { type: "button", disabled: true, onclick: () => show(page - 1) }, "← Newer");
  const next = h("button", { type: "button", disabled: true, onclick: () => show(page + 1) }, "Older →");
  const where = h("span.muted");
  ctx.root.append(
    h("h1", {}, "Fine-tunes", h("a.button", { href: "#/new" }, "New fine-tune")),
    problem,
    h(
      "table",
      { "data-testid": "jobs" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", {}, "ID"),
          h("th", {}, "Name"),
          h("th", {}, "Model"),
          h("th", {}, "Status"),
          h("th.num", {}, "Step / steps"),
          h("th.num", {}, "Last loss"),
          h("th", {}, "Created"),
        ),
      ),
      body,
    ),
    h("div.pager", {}, previous, next, where),
  );

  async function show(index) {
    const after = cursors[index];
    const query = `/v1/fine-tunes?limit=${PAGE}` + (after ? `&after=${encodeURIComponent(after)}` : "");
    let answer;
    try {
      answer = await get(query);
    } catch (error) {
      if (!ctx.failed(error)) problem.replaceChildren(notice("error", error.message));
      return;
    }
    if (ctx.signal.aborted) return;
    problem.replaceChildren();
    page = index;
    const jobs = answer.data;
    if (jobs.length) cursors[index + 1] = jobs[jobs.length - 1].id;
    body.replaceChildren(
      ...jobs.map((job) =>
        h(
          "tr",
          { "data-job": job.id },
          h("td.mono", {}, h("a", { href: `#/jobs/${job.id}` }, job.id)),
          h("td", {}, job.name ?? "—"),
          h("td", {}, job.model),
          h("td", {}, statusBadge(job.status)),
          h("td.num", {}, `${job.step} / ${job.steps}`),
          h("td.num", {}, number(job.loss)),
          h("td", {}, when(job.created_at)),
        ),
      ),
    );
    if (!jobs.length) {
      body.append(
        h("tr", {}, h("td.muted", { colspan: 7 }, page ? "No more fine-tunes." : "No fine-tunes yet: start one.")),
      );
    }
    previous.disabled = page === 0;
    next.disabled = !answer.has_more;
    where.textContent = `page ${page + 1}`;
  }

  await show(0);
  ctx.every(REFRESH_MS, () => show(page));
}
