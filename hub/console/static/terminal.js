// The device page's terminal: the browser is the WebRTC peer. It asks the hub for a tunnel session to
// the device's `shell` target (the same session, grant, renewal and usage rules as `fleethub tunnel`:
// a tunnel token from POST /v1/cli/tunnel/token with the dashboard's cookie session + CSRF, then the
// /v1/cli/tunnel/session endpoints with that token), connects its own RTCPeerConnection to the device,
// and joins xterm.js to a `shell` data channel, where the agent has a PTY (device_client/shell.py).
//
// The `shell` channel speaks webrtc/forward.py's protocol: binary messages are the PTY's bytes; text
// messages are JSON: {credit: n} (the receiver took n more bytes: send only within credit) and, from
// here, {resize: {cols, rows}}. A `control` channel carries the grant renewals and the device's
// {type: "closing", reason}. Closing the tab closes the session (DELETE with fetch keepalive on
// pagehide); the session's expiry is the backstop when even that does not leave.
import { session } from './api.js';
import { h, fill } from './dom.js';

const VENDOR = '/console/static/vendor/xterm/';
const WINDOW = 2 * 1024 * 1024; // credit we grant the device (forward.WINDOW)
const CREDIT_STEP = WINDOW / 4; // grant again once this much was written to the screen
const GATHER_TIMEOUT = 5000; // ms: aiortc does not trickle, so the offer waits for every candidate
const CONNECT_TIMEOUT = 30000; // ms for the data channel to open after the answer

let vendorLoaded = null;

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const script = document.createElement('script');
    script.src = src;
    script.onload = resolve;
    script.onerror = () => reject(new Error(`cannot load ${src}`));
    document.head.append(script);
  });
}

function loadVendor() {
  // xterm's builds are UMD scripts (globals), not ES modules; loaded once, on first use
  if (!vendorLoaded) {
    const css = document.createElement('link');
    css.rel = 'stylesheet';
    css.href = `${VENDOR}xterm.css`;
    document.head.append(css);
    vendorLoaded = loadScript(`${VENDOR}xterm.js`)
      .then(() => Promise.all([loadScript(`${VENDOR}addon-fit.js`), loadScript(`${VENDOR}addon-canvas.js`)]));
  }
  return vendorLoaded;
}

class TunnelHttpError extends Error {
  constructor(status, body) {
    super((body && (body.message || body.error_code)) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error_code;
  }
}

async function tunnelToken() {
  // the dashboard's own session (cookie + CSRF) gets a tunnel token, as a CLI's PAT does
  const headers = { Accept: 'application/json', 'X-Organization-ID': session.org };
  if (session.csrf) headers['X-CSRF-Token'] = session.csrf;
  const r = await fetch('/v1/cli/tunnel/token', { method: 'POST', headers, credentials: 'same-origin' });
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new TunnelHttpError(r.status, body);
  return body.data.token;
}

async function tunnelCall(method, path, token, payload, keepalive = false) {
  const headers = { Accept: 'application/json', Authorization: `Bearer ${token}` };
  if (payload !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, { method, headers, keepalive, credentials: 'omit',
    body: payload === undefined ? undefined : JSON.stringify(payload) });
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new TunnelHttpError(r.status, body);
  return body.data;
}

function gathered(pc) {
  return new Promise((resolve) => {
    if (pc.iceGatheringState === 'complete') { resolve(); return; }
    const timer = setTimeout(resolve, GATHER_TIMEOUT);
    pc.addEventListener('icegatheringstatechange', () => {
      if (pc.iceGatheringState === 'complete') { clearTimeout(timer); resolve(); }
    });
  });
}

// One terminal session: hub session + peer connection + xterm. `onState(state, why)` paints the line.
class TerminalSession {
  constructor(deviceId, screen, onState) {
    this.deviceId = deviceId;
    this.screen = screen;
    this.onState = onState;
    this.closed = false;
    this.sid = null;
    this.token = null;
    this.credit = 0; // bytes the device lets us send
    this.outbox = []; // keystrokes waiting for credit
    this.consumed = 0; // bytes written to the screen since the last grant
    this.timers = [];
    this.onPageHide = () => this.close('the tab was closed', { keepalive: true });
  }

  async open() {
    this.onState('connecting', 'loading the terminal');
    await loadVendor();
    if (this.closed) return;
    const term = this.term = new window.Terminal({ cursorBlink: true, convertEol: false, fontSize: 14 });
    this.fit = new window.FitAddon.FitAddon();
    term.loadAddon(this.fit);
    // before open: the canvas renderer takes over at open, so the DOM renderer (whose <style> elements
    // the CSP refuses) is never made; see vendor/xterm/VERSIONS.md
    term.loadAddon(new window.CanvasAddon.CanvasAddon());
    term.open(this.screen);
    this.fit.fit();
    // the browser tests read the screen's buffer, and bench/terminal_echo.py times keystrokes, through these
    this.screen.fleethubTerminal = term;
    this.screen.fleethubSession = this;
    term.onData((text) => this.send(new TextEncoder().encode(text)));
    term.onBinary((text) => this.send(Uint8Array.from(text, (c) => c.charCodeAt(0))));
    term.onResize(({ cols, rows }) => this.sendResize(cols, rows));
    this.onWindowResize = () => { try { this.fit.fit(); } catch { /* not laid out */ } };
    window.addEventListener('resize', this.onWindowResize);
    window.addEventListener('pagehide', this.onPageHide);

    this.onState('connecting', 'asking the hub for ICE servers');
    this.token = await tunnelToken();
    // before the offer: a browser hides its host addresses behind mDNS names the device cannot
    // resolve, so the offer carries our own relay candidate when the organisation may relay
    const ice = await tunnelCall('GET', '/v1/cli/tunnel/ice-servers', this.token);
    if (this.closed) return;
    this.onState('connecting', 'gathering network candidates');
    const pc = this.pc = new RTCPeerConnection({ iceServers: ice.ice_servers || [] });
    this.control = pc.createDataChannel('control');
    this.control.onmessage = (e) => this.onControl(e.data);
    const channel = this.channel = pc.createDataChannel('shell');
    channel.binaryType = 'arraybuffer';
    channel.onopen = () => this.onOpen();
    channel.onmessage = (e) => this.onMessage(e.data);
    channel.onclose = () => this.close('the shell exited');
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === 'failed') this.close('the connection to the device failed');
    };
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    if (this.closed) return;

    this.onState('connecting', 'asking the hub for a session');
    const opened = await tunnelCall('POST', '/v1/cli/tunnel/session', this.token, {
      device_id: this.deviceId, target: 'shell',
      offer: { type: 'offer', sdp: pc.localDescription.sdp } });
    this.sid = opened.session_id;
    this.grant = opened.grant;
    if (this.closed) { this.hubClose(false); return; }
    this.onState('connecting', 'connecting to the device');
    await pc.setRemoteDescription(opened.answer);
    this.scheduleRenewal(opened.expires_at);
    this.timers.push(setTimeout(() => {
      if (channel.readyState !== 'open') this.close('no connection to the device (a browser behind NAT needs the TURN relay)');
    }, CONNECT_TIMEOUT));
  }

  onOpen() {
    this.channel.send(JSON.stringify({ credit: WINDOW }));
    this.sendResize(this.term.cols, this.term.rows);
    this.onState('connected', '');
    this.term.focus();
  }

  onMessage(data) {
    if (typeof data === 'string') {
      let msg = null;
      try { msg = JSON.parse(data); } catch { return; }
      if (msg && Number.isInteger(msg.credit)) { this.credit += msg.credit; this.flush(); }
      return;
    }
    const bytes = new Uint8Array(data);
    this.term.write(bytes, () => {
      // granted back only once on screen: a slow screen holds the device back (bounded buffering)
      this.consumed += bytes.length;
      if (this.consumed >= CREDIT_STEP && this.channel.readyState === 'open') {
        this.channel.send(JSON.stringify({ credit: this.consumed }));
        this.consumed = 0;
      }
    });
  }

  send(bytes) {
    this.outbox.push(bytes);
    this.flush();
  }

  flush() {
    while (this.outbox.length && this.credit > 0 && this.channel && this.channel.readyState === 'open') {
      let chunk = this.outbox[0];
      if (chunk.length > this.credit) {
        this.outbox[0] = chunk.subarray(this.credit);
        chunk = chunk.subarray(0, this.credit);
      } else {
        this.outbox.shift();
      }
      this.credit -= chunk.length;
      this.channel.send(chunk);
    }
  }

  sendResize(cols, rows) {
    if (this.channel && this.channel.readyState === 'open') {
      this.channel.send(JSON.stringify({ resize: { cols, rows } }));
    }
  }

  onControl(text) {
    let msg = null;
    try { msg = JSON.parse(text); } catch { return; }
    if (msg && msg.type === 'closing') this.close(`the device closed the session (${msg.reason || 'no reason'})`);
  }

  scheduleRenewal(expiresAt) {
    // renew at two thirds of the grant's remaining life, as the CLI does
    const left = new Date(expiresAt).getTime() - Date.now();
    this.timers.push(setTimeout(() => this.renew(), Math.max(1000, (left * 2) / 3)));
  }

  async renew() {
    if (this.closed) return;
    try {
      this.token = await tunnelToken(); // the tunnel token lives 15 minutes; a fresh one each time
      const renewed = await tunnelCall('POST', `/v1/cli/tunnel/session/${this.sid}/renew`, this.token, { grant: this.grant });
      this.grant = renewed.grant;
      if (this.control.readyState === 'open') this.control.send(JSON.stringify({ type: 'renew', grant: renewed.grant }));
      this.scheduleRenewal(renewed.expires_at);
    } catch (err) {
      // the device ends the session when the grant runs out; say why now
      this.onState('connected', `renewal refused: ${err.message}`);
    }
  }

  hubClose(keepalive) {
    if (!this.sid || !this.token) return;
    tunnelCall('DELETE', `/v1/cli/tunnel/session/${this.sid}`, this.token, undefined, keepalive).catch(() => {});
  }

  close(why, { keepalive = false } = {}) {
    if (this.closed) return;
    this.closed = true;
    this.timers.forEach(clearTimeout);
    window.removeEventListener('pagehide', this.onPageHide);
    if (this.onWindowResize) window.removeEventListener('resize', this.onWindowResize);
    if (this.control && this.control.readyState === 'open') {
      try { this.control.send(JSON.stringify({ type: 'closing', reason: 'client_closed' })); } catch { /* gone */ }
    }
    this.hubClose(keepalive);
    if (this.pc) this.pc.close();
    if (this.term) this.term.options.disableStdin = true;
    this.onState('closed', why);
  }
}

// Mount into the device page's #terminal section. `deviceId`: the page's device.
export function mountTerminal(section, deviceId) {
  const state = h('p', { id: 'terminal-state', class: 'muted', 'aria-live': 'polite' }, 'closed: not opened yet');
  const screen = h('div', { id: 'terminal-screen', class: 'terminal-screen' });
  screen.style.height = '26em'; // xterm's fit addon sizes the terminal to its box (CSSOM: CSP allows it)
  const openButton = h('button', { type: 'button', id: 'terminal-open' }, 'Open terminal');
  const closeButton = h('button', { type: 'button', id: 'terminal-close', disabled: true }, 'Close');
  let current = null;

  function paint(kind, why) {
    state.textContent = why ? `${kind}: ${why}` : kind;
    state.dataset.state = kind;
    openButton.disabled = kind !== 'closed';
    closeButton.disabled = kind === 'closed';
  }

  openButton.addEventListener('click', () => {
    fill(screen);
    const s = current = new TerminalSession(deviceId, screen, (kind, why) => { if (current === s) paint(kind, why); });
    s.open().catch((err) => s.close(err.message));
  });
  closeButton.addEventListener('click', () => current && current.close('closed by you'));
  const placeholder = section.querySelector('#terminal-placeholder');
  if (placeholder) placeholder.remove();
  section.append(h('div', { class: 'row' }, openButton, closeButton), state, screen);
}
