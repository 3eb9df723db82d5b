// The console's shell: which view the URL's fragment names, sign in and out, and leaving a view
// (its timers and streams stop).

import { APIError, apiKey, get, signIn, signOut } from "./api.js";
import { h, notice } from "./dom.js";
import { createView } from "./create.js";
import { deploymentView, deploymentsView } from "./deployments.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { sessionView, sessionsView } from "./sessions.js";

const routes = [
  [/^#\/jobs\/([\w.-]+)$/, jobView],
  [/^#\/jobs$/, jobsView],
  [/^#\/new$/, createView],
  [/^#\/sessions\/([\w.-]+)$/, sessionView],
  [/^#\/sessions$/, sessionsView],
  [/^#\/deployments\/([\w.-]+)$/, deploymentView],
  [/^#\/deployments$/, deploymentsView],
];

const view = document.getElementById("view");
const nav = document.getElementById("nav");
let leave = () => {};
let signInMessage = null;

// What a view gets: where to draw, and a way to register what must stop when the user leaves.
function context() {
  const cleanups = [];
  const controller = new AbortController();
  cleanups.push(() => controller.abort());
  return {
    root: view,
    signal: controller.signal,
    every(ms, fn) {
      const timer = setInterval(fn, ms);
      cleanups.push(() => clearInterval(timer));
    },
    onLeave(fn) {
      cleanups.push(fn);
    },
    failed(error) {
      if (error instanceof APIError && error.status === 401) {
        signOut();
        signInMessage = `Signed out: ${error.message}`;
        route();
        return true;
      }
      return false;
    },
    leave() {
      for (const fn of cleanups.splice(0)) fn();
    },
  };
}

async function route() {
  leave();
  view.replaceChildren();
  if (!apiKey()) {
    nav.hidden = true;
    renderSignIn();
    leave = () => {};
    return;
  }
  nav.hidden = false;
  const hash = location.hash || "#/jobs";
  for (const link of nav.querySelectorAll("a[data-nav]")) {
    link.classList.toggle("active", hash.startsWith(`#/${link.dataset.nav}`));
  }
  const ctx = context();
  leave = () => ctx.leave();
  for (const [pattern, render] of routes) {
    const match = hash.match(pattern);
    if (match) {
      try {
        await render(ctx, ...match.slice(1));
      } catch (error) {
        if (!ctx.failed(error) && !ctx.signal.aborted) view.append(notice("error", error.message));
      }
      return;
    }
  }
  location.hash = "#/jobs";
}

function renderSignIn() {
  const input = h("input", {
    type: "password",
    name: "api-key",
    id: "api-key",
    autocomplete: "off",
    placeholder: "relay-…",
    required: true,
  });
  const problem = h("div");
  if (signInMessage) problem.append(notice("error", signInMessage));
  const form = h(
    "form.card.signin",
    {
      onsubmit: async (event) => {
        event.preventDefault();
        problem.replaceChildren();
        signIn(input.value.trim());
        try {
          await get("/v1/fine-tunes?limit=1"); // the key works
          signInMessage = null;
          if (!location.hash || location.hash === "#/signin") location.hash = "#/jobs";
          route();
        } catch (error) {
          signOut();
          problem.append(notice("error", error.message));
        }
      },
    },
    h("h1", {}, "Sign in"),
    h("label", { for: "api-key" }, "API key"),
    input,
    problem,
    h("button.primary", { type: "submit" }, "Sign in"),
    h(
      "p.muted",
      {},
      "The key stays in this browser tab (session storage) and is sent only to this server. " +
        "`relay keys create --user NAME` makes one; the embedded server prints where its key is.",
    ),
  );
  view.append(form);
  input.focus();
}

document.getElementById("sign-out").addEventListener("click", () => {
  signOut();
  signInMessage = null;
  route();
});
window.addEventListener("hashchange", route);
route();
