// The console's link to the API: the key the user signed in with (session storage only, so it
// goes when the tab closes), requests with it as the Bearer header, and the API's errors.

const KEY = "relay.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY);
}

export function signIn(key) {
  sessionStorage.setItem(KEY, key);
}

export function signOut() {
  sessionStorage.removeItem(KEY);
}

// An error answer of the API: {"error": {"message", "type", "param", "code"}} and its status.
export class APIError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `the server answered ${status}`);
    this.status = status;
    this.param = error.param || null;
    this.code = error.code || null;
  }
}

function headers(extra) {
  const key = apiKey();
  return { ...(key ? { authorization: `Bearer ${key}` } : {}), ...extra };
}

export async function request(method, path, body, extraHeaders = {}, signal = undefined) {
  const init = {
    method,
    headers: headers({ ...(body === undefined ? {} : { "content-type": "application/json" }), ...extraHeaders }),
    signal,
  };
  if (body !== undefined) init.body = JSON.stringify(body);
  const answer = await fetch(path, init);
  const text = await answer.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = null;
  }
  if (!answer.ok) throw new APIError(answer.status, parsed);
  return parsed;
}

export const get = (path, { signal } = {}) => request("GET", path, undefined, {}, signal);
export const post = (path, body, extraHeaders) => request("POST", path, body, extraHeaders);

// A file of a job fetched with the key, as a blob: URL for the page to show (a video's src).
export async function fileURL(path) {
  const answer = await fetch(path, { headers: headers({}) });
  if (!answer.ok) throw new APIError(answer.status, null);
  return URL.createObjectURL(await answer.blob());
}

// A file of a job, fetched with the key and handed to the browser as a download (a plain link
// cannot carry the Authorization header, and the key never goes into a URL). Returns the sha256
// the server sent with it.
export async function download(path, name) {
  const answer = await fetch(path, { headers: headers({}) });
  if (!answer.ok) {
    let body = null;
    try {
      body = await answer.json();
    } catch {
      body = null;
    }
    throw new APIError(answer.status, body);
  }
  const url = URL.createObjectURL(await answer.blob());
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
  return answer.headers.get("x-checksum-sha256");
}

// Reads a server-sent-event stream with fetch(), since EventSource cannot send the Authorization
// header. Calls onEvent(id, data) per event and resolves when the stream ends (after "[DONE]")
// or `signal` aborts it; it reconnects after a dropped connection from the last id it saw.
export async function followEvents(path, { onEvent, signal, after = null }) {
  let last = after;
  for (let attempt = 0; !signal.aborted; attempt++) {
    const hdrs = headers({ accept: "text/event-stream" });
    if (last !== null) hdrs["last-event-id"] = String(last);
    let answer;
    try {
      answer = await fetch(path, { headers: hdrs, signal });
    } catch (error) {
      if (signal.aborted) return;
      await pause(Math.min(5000, 500 * (attempt + 1)), signal);
      continue;
    }
    if (!answer.ok) throw new APIError(answer.status, await answer.json().catch(() => null));
    const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let event = { id: null, data: [] };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let newline;
        while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
          const line = buffer.slice(0, newline);
          buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
          if (line === "") {
            if (event.data.length) {
              const data = event.data.join("\n");
              if (data === "[DONE]") return;
              if (event.id !== null) last = Number(event.id);
              onEvent(event.id, JSON.parse(data));
            }
            event = { id: null, data: [] };
          } else if (!line.startsWith(":")) {
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "data") event.data.push(value);
            else if (field === "id") event.id = value;
          }
        }
      }
    } catch (error) {
      if (signal.aborted) return;
    }
    attempt = 0;
    await pause(500, signal);
  }
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}
