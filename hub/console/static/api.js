// The console's one door to the API: same origin, the session cookie, the organisation header, the
// CSRF token on every mutating call, and server-sent events read through fetch (EventSource cannot
// send the X-Organization-ID header the streams need).

const ORG_KEY = 'fleethub.org';
const EMAIL_KEY = 'fleethub.email';
const GET_RETRIES = 2; // a GET answered 503 is asked again this many times (api below)

export const session = {
  csrf: null,
  // set by Sign out: the 401s of requests still in flight then send nobody anywhere. Each would start a
  // navigation to the sign-in page (with ?next=) racing the sign-out's own, and one of the two was aborted.
  leaving: false,
  me: null,
  org: localStorage.getItem(ORG_KEY),
  email: localStorage.getItem(EMAIL_KEY),
  setOrg(id) { this.org = id; if (id) localStorage.setItem(ORG_KEY, id); else localStorage.removeItem(ORG_KEY); },
  setEmail(email) { this.email = email; if (email) localStorage.setItem(EMAIL_KEY, email); },
};

export class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.message || body.error)) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error;
    this.body = body;
  }
}

export function signInUrl() {
  return `/console/signin?next=${encodeURIComponent(location.pathname + location.search)}`;
}

export async function api(method, path, body, options = {}) {
  const headers = { Accept: 'application/json' };
  if (options.org !== false && session.org) headers['X-Organization-ID'] = session.org;
  if (method !== 'GET' && method !== 'HEAD' && session.csrf) headers['X-CSRF-Token'] = session.csrf;
  let payload;
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    payload = JSON.stringify(body);
  }
  const ask = () => fetch(path, { method, headers, body: payload, credentials: 'same-origin' });
  let response = await ask();
  // A read answered 503 (the hub's database unreachable for a moment: "try again shortly") is asked
  // again, twice, after Retry-After or 1 then 2 s (at most 5): a blip leaves no page half-drawn on a
  // busy hub. Only GET is repeated: a write answered 503 may still have happened.
  for (let retry = 1; retry <= GET_RETRIES && response.status === 503 && method === 'GET'; retry += 1) {
    const after = Number(response.headers.get('Retry-After'));
    await new Promise((resolve) => setTimeout(resolve, 1000 * Math.min(5, after > 0 ? after : retry)));
    response = await ask();
  }
  const type = response.headers.get('content-type') || '';
  const data = type.includes('application/json') ? await response.json() : null;
  if (response.status === 401 && options.redirect !== false && !session.leaving) {
    location.assign(signInUrl());
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

function parseEvent(block) {
  let event = 'message';
  let id = null;
  const data = [];
  for (const line of block.split('\n')) {
    if (!line || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (name === 'event') event = value;
    else if (name === 'id') id = value;
    else if (name === 'data') data.push(value);
  }
  if (!data.length) return null;
  try {
    return { event, id, data: JSON.parse(data.join('\n')) };
  } catch {
    return null;
  }
}

// Follow an SSE stream; reconnects with backoff (1 s doubling to 15 s) unless the answer says it
// never will work (401 → sign in, 403, 404). A hidden tab lets its stream go and takes it again when
// shown: over HTTP/1.1 a browser keeps at most 6 connections to one origin, so open streams in
// background tabs would otherwise starve the visible one (state 'paused'; on 'live' again the page
// reads what it shows afresh). A reconnect after a dropped stream sends the last event id seen as
// Last-Event-ID, as EventSource does: the hub replays what the stream missed, with no snapshot, no gap
// and no duplicate (docs/events.md); one past the log's retention (410) starts afresh. Returns a
// function that stops following.
export function follow(path, onEvent, onState) {
  const state = onState || (() => {});
  let control = null;
  let stopped = false;

  async function run(signal) {
    let delay = 1000;
    let lastId = null; // this run's: a stream taken again after a pause starts afresh
    while (!signal.aborted) {
      try {
        const headers = { 'X-Organization-ID': session.org || '', Accept: 'text/event-stream' };
        if (lastId !== null) headers['Last-Event-ID'] = lastId;
        const response = await fetch(path, { headers, credentials: 'same-origin', signal });
        if (response.status === 401) { if (!session.leaving) location.assign(signInUrl()); return; }
        if (response.status === 410) { lastId = null; continue; }
        if (response.status === 403 || response.status === 404) { state('refused', response.status); return; }
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        state('live');
        delay = 1000;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer = (buffer + value).replace(/\r\n?/g, '\n');
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const event = parseEvent(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
            if (event && event.id !== null) lastId = event.id;
            if (event) onEvent(event.data, event.event);
          }
        }
      } catch (err) {
        if (signal.aborted) return;
      }
      state('reconnecting');
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }

  function start() {
    if (stopped || control) return;
    control = new AbortController();
    run(control.signal);
  }
  function pause() {
    if (!control) return;
    control.abort();
    control = null;
    state('paused');
  }
  const onVisibility = () => (document.visibilityState === 'hidden' ? pause() : start());
  document.addEventListener('visibilitychange', onVisibility);
  if (document.visibilityState !== 'hidden') start(); else state('paused');
  return () => {
    stopped = true;
    document.removeEventListener('visibilitychange', onVisibility);
    if (control) control.abort();
  };
}

// A device's, fleet's or configuration's name for a page that holds only its id, read once per
// organisation and id and kept until the console is reloaded (names change seldom; a reload reads them
// again). One the caller cannot read (deleted, or not theirs to view) stays its id.
const NAMES = new Map();
const NAMED = { device: 'devices', fleet: 'fleets', configuration: 'configurations' };

export function nameOf(kind, id) {
  if (!id || !NAMED[kind]) return Promise.resolve(id || '');
  const key = `${session.org} ${kind} ${id}`;
  if (!NAMES.has(key)) {
    NAMES.set(key, api('GET', `/v1/${NAMED[kind]}/${encodeURIComponent(id)}`, undefined, { redirect: false })
      .then((r) => r.data.name, () => id));
  }
  return NAMES.get(key);
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== '' && v !== null && v !== undefined) q.set(k, v);
  return q.toString();
}

// POST that answers with server-sent events (the assistant): each event's JSON data to onData as
// it arrives. Errors before the stream starts come back as an ApiError, as from api().
export async function postStream(path, body, onData) {
  const headers = { 'Content-Type': 'application/json', Accept: 'text/event-stream', 'X-CSRF-Token': session.csrf || '' };
  if (session.org) headers['X-Organization-ID'] = session.org;
  const response = await fetch(path, { method: 'POST', headers, body: JSON.stringify(body), credentials: 'same-origin' });
  if (!response.ok) {
    const type = response.headers.get('content-type') || '';
    throw new ApiError(response.status, type.includes('json') ? await response.json() : null);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + value).replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = parseEvent(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (event) onData(event.data, event.event);
    }
  }
}
