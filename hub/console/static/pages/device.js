// One device: live state over its own event stream, facts from its hello and telemetry, configuration
// and each secret file's delivery, ping and reboot, rename, tags, move and delete, memory tests, and
// the place the terminal module fills. Fleets and configurations are shown by name, versions by number.
import { api, follow } from '../api.js';
import { fill, h, badge, bytes, confirmDialog, field, notice, when } from '../dom.js';
import { celsius, duration, percent } from '../format.js';
import { mountTerminal } from '../terminal.js';
import { configBadge, rejectionOutput } from '../configstatus.js';
import { splitTags } from '../adddevice.js';

const MODES = {
  live: { label: 'Live', plan: { impact: 'running', placement: 'online' }, hint: 'tests free memory beside the running workload' },
  quick: { label: 'Live Quick', plan: { impact: 'running', placement: 'online', quick: true }, hint: 'at most a quarter of free memory (≤ 512 MiB), one pass' },
  full: { label: 'Full online', plan: { impact: 'stopped', placement: 'online' }, hint: 'stops the workload and tests nearly all free memory' },
  boot: { label: 'Test boot', plan: { impact: 'stopped', placement: 'offline' }, hint: 'reboots into a test boot; a kernel sweep, then the full suite' },
};
const MAX_EVENTS = 100;

function dl(pairs) {
  return h('dl', { class: 'facts' }, pairs.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v ?? '–')]));
}

function uptime(seconds) {
  if (typeof seconds !== 'number') return null;
  const d = Math.floor(seconds / 86400);
  const hrs = Math.floor((seconds % 86400) / 3600);
  const min = Math.floor((seconds % 3600) / 60);
  return d ? `${d} d ${hrs} h` : hrs ? `${hrs} h ${min} min` : `${min} min`;
}

function share(percent, total) {
  if (typeof percent !== 'number') return null;
  const bar = h('meter', { class: 'meter', min: 0, max: 100, low: 70, high: 90, optimum: 0, value: percent });
  return [`${percent.toFixed(1)} %`, total ? ` of ${bytes(total)}` : '', bar];
}

function fmtRate(bps) {
  return typeof bps === 'number' ? `${bytes(bps)}/s` : '–';
}

export async function render(main, id) {
  let device = (await api('GET', `/v1/devices/${id}`)).data;
  const fleets = await api('GET', '/v1/fleets?limit=500').then((r) => r.data).catch(() => []);
  const fleetName = new Map(fleets.map((f) => [f.id, f.name]));
  const configName = new Map(); // config id -> its name, or null: not readable by this person
  function nameOf(configId) {
    if (!configName.has(configId)) {
      configName.set(configId, undefined);
      api('GET', `/v1/configurations/${configId}`).then((r) => r.data.name).catch(() => null)
        .then((name) => { configName.set(configId, name); paintDevice(); });
    }
    const name = configName.get(configId);
    return name === undefined ? '…' : name || 'a configuration you cannot see';
  }
  const title = h('h1', { id: 'device-name' }, device.name);
  const state = h('span', { id: 'device-state' });
  const live = h('span', { id: 'live', class: 'muted' }, 'connecting…');
  const actionStatus = h('div', { id: 'action-status', 'aria-live': 'polite' });
  const facts = h('div', { id: 'facts' });
  const config = h('div', { id: 'configuration' });
  // A container version's images arriving: the device's container.pull_progress and container.pulled
  // events (docs/containers.md), one line per container, newest state of each.
  const pulls = h('ul', { id: 'pulls', class: 'plain', hidden: true });
  const pulling = new Map();
  function showPull(kind, p) {
    const line = kind === 'container.pull_progress'
      ? `Pulling ${p.container}: ${bytes(p.bytes)} so far, ${bytes(p.rateBps)}/s`
      : `Pulled ${p.container}: ${bytes(p.bytes)} in ${duration(p.seconds)}${p.via ? ` (from the ${p.via})` : ''}`;
    pulling.set(p.container, line);
    fill(pulls, [...pulling.values()].map((text) => h('li', {}, text)));
    pulls.hidden = false;
  }
  const files = h('div', { id: 'secret-files' });
  const fileStatus = h('div', { 'aria-live': 'polite' });
  const events = h('ol', { id: 'events', class: 'events', reversed: true });
  const progress = h('div', { id: 'memtest-progress', 'aria-live': 'polite' });
  const results = h('div', { id: 'memtest-results' });
  const diagnosis = h('div', { id: 'diagnosis' });
  const memStatus = h('div', { 'aria-live': 'polite' });

  const ping = h('button', { type: 'button', id: 'ping', class: 'secondary' }, 'Ping');
  ping.addEventListener('click', async () => {
    try {
      const r = await api('POST', `/v1/devices/${id}/ping`);
      notice(actionStatus, `Ping: ${r.data.roundTripMs} ms round trip.`, 'ok');
    } catch (err) { notice(actionStatus, `Ping failed: ${err.message}`, 'error'); }
  });
  const reboot = h('button', { type: 'button', id: 'reboot', class: 'danger' }, 'Reboot');
  reboot.addEventListener('click', async () => {
    if (!await confirmDialog('Reboot device', `Reboot ${device.name} now?`, 'Reboot')) return;
    try { await api('POST', `/v1/devices/${id}/reboot`); notice(actionStatus, 'Reboot sent.', 'ok'); } catch (err) {
      notice(actionStatus, `Reboot failed: ${err.message}`, 'error');
    }
  });

  // Revert: a rollout of the version the device ran before, over this device alone, with a rollout's
  // gates (its fleet's window unless forced), so it shows on the rollouts page like any other.
  const revert = h('button', { type: 'button', id: 'revert', class: 'secondary' }, 'Revert');
  revert.addEventListener('click', async () => {
    const c = device.configuration || {};
    if (!c.previous_version_id) { notice(actionStatus, 'Revert: the device has run no other version before this one.', 'error'); return; }
    if (!await confirmDialog('Revert device', `Roll ${device.name} back to v${c.previous_version ?? '?'}, the version it ran before (a rollout; it waits for the fleet's update window)?`, 'Revert')) return;
    try {
      const ro = (await api('POST', `/v1/devices/${id}/revert`)).data;
      notice(actionStatus, h('span', {}, 'Revert started: ', h('a', { href: `/console/rollouts/${ro.id}` }, `rollout ${ro.id.slice(0, 8)}`)), 'ok');
    } catch (err) { notice(actionStatus, `Revert refused: ${err.message}`, 'error'); }
  });

  // -- rename, tags, move to another fleet (PATCH), delete (DELETE: its token stops working)
  const editName = h('input', { name: 'name', required: true, maxlength: 200 });
  const editTags = h('input', { name: 'tags', placeholder: 'eu, kiosk' });
  const editFleet = h('select', { name: 'fleet_id' }, h('option', { value: '' }, 'No fleet'),
    fleets.map((f) => h('option', { value: f.id }, f.name)));
  const editStatus = h('div', { id: 'edit-status', 'aria-live': 'polite' });
  const editForm = h('form', { id: 'device-edit', class: 'row' }, field('Name', editName),
    field('Tags', editTags, 'comma-separated'), field('Fleet', editFleet), h('button', { type: 'submit' }, 'Save'),
    h('button', { type: 'button', id: 'device-delete', class: 'danger', onclick: removeDevice }, 'Delete device'));
  function fillEdit() {
    editName.value = device.name;
    editTags.value = (device.tags || []).join(', ');
    editFleet.value = device.fleet_id || '';
  }
  editForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    notice(editStatus, '');
    const changes = {};
    if (editName.value.trim() !== device.name) changes.name = editName.value.trim();
    const tags = splitTags(editTags.value);
    if (tags.join(',') !== (device.tags || []).join(',')) changes.tags = tags;
    if ((editFleet.value || null) !== (device.fleet_id || null)) changes.fleet_id = editFleet.value || null;
    if (!Object.keys(changes).length) { notice(editStatus, 'Nothing changed.', ''); return; }
    try {
      device = (await api('PATCH', `/v1/devices/${id}`, changes)).data;
      paintDevice();
      fillEdit();
      notice(editStatus, 'Saved.', 'ok');
    } catch (err) { notice(editStatus, err.message, 'error'); }
  });
  async function removeDevice() {
    if (!await confirmDialog('Delete device', `Delete ${device.name}? Its token stops working at once and the `
      + 'hub forgets its files and history. The agent on the device stays installed until you remove it.', 'Delete')) return;
    try {
      await api('DELETE', `/v1/devices/${id}`);
      location.assign(`/console/devices?deleted=${encodeURIComponent(device.name)}`);
    } catch (err) { notice(editStatus, err.message, 'error'); }
  }

  // -- secret files: upload is write-only (the content never comes back); metadata and delivery
  const path = h('input', { name: 'path', required: true, placeholder: '/etc/app/secret.key', spellcheck: 'false' });
  const mode = h('input', { name: 'mode', value: '0600', pattern: '0?[0-7]{3}', size: 5 });
  const content = h('textarea', { name: 'content', rows: 3, spellcheck: 'false', autocomplete: 'off' });
  const upload = h('input', { type: 'file', name: 'file' });
  const fileForm = h('form', { id: 'secret-upload', class: 'inline-form' },
    field('Path on the device', path), field('Mode', mode), field('Content (or choose a file)', content), field('File', upload),
    h('button', { type: 'submit' }, 'Upload'));
  fileForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    let raw;
    if (upload.files.length) raw = new Uint8Array(await upload.files[0].arrayBuffer());
    else raw = new TextEncoder().encode(content.value);
    let binary = '';
    for (const b of raw) binary += String.fromCharCode(b);
    try {
      await api('POST', `/v1/devices/${id}/secret-files`, { path: path.value, mode: mode.value, content_base64: btoa(binary) });
      content.value = ''; upload.value = '';
      notice(fileStatus, 'Uploaded; its content will not be shown again.', 'ok');
      await loadFiles();
      watchFiles();
    } catch (err) { notice(fileStatus, err.message, 'error'); }
  });

  // -- memory tests
  const modeRadios = Object.entries(MODES).map(([key, m], i) => h('label', { class: 'radio' },
    h('input', { type: 'radio', name: 'memmode', value: key, checked: i === 1 }), ` ${m.label} `, h('small', { class: 'muted' }, m.hint)));
  const passes = h('input', { type: 'number', name: 'passes', min: 1, max: 20, placeholder: 'mode default' });
  const budget = h('input', { type: 'number', name: 'budget', min: 60, max: 43200, placeholder: '7200' });
  const memForm = h('form', { id: 'memtest-start' }, h('fieldset', {}, h('legend', {}, 'Mode'), modeRadios),
    h('div', { class: 'row' }, field('Passes', passes), field('Time budget (s)', budget)),
    h('div', { class: 'row' }, h('button', { type: 'submit', id: 'memtest-run' }, 'Start memory test'),
      h('button', { type: 'button', id: 'memtest-cancel', class: 'secondary', onclick: cancelTest }, 'Cancel test')));
  memForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const key = memForm.elements.memmode.value;
    const plan = { ...MODES[key].plan };
    if (passes.value) plan.passes = Number(passes.value);
    if (budget.value) plan.timeBudgetSeconds = Number(budget.value);
    if (key === 'boot' && !await confirmDialog('Test boot', 'The device reboots into a test boot and is out of service until the test ends.', 'Reboot and test')) return;
    try {
      const r = await api('POST', `/v1/devices/${id}/memory-test`, plan);
      notice(memStatus, `Started run ${r.data.runId}.`, 'ok');
      showProgress({ kind: 'memory_test', runId: r.data.runId, phase: r.data.status?.phase || 'preparing' });
    } catch (err) { notice(memStatus, err.message, 'error'); }
  });
  async function cancelTest() {
    try { await api('POST', `/v1/devices/${id}/memory-test/cancel`); notice(memStatus, 'Cancel sent.', 'ok'); } catch (err) {
      notice(memStatus, err.message, 'error');
    }
  }

  fill(main, 
    h('div', { class: 'title' }, title, state, live),
    h('div', { class: 'row' }, ping, reboot, revert), actionStatus,
    h('div', { class: 'grid' },
      h('section', { class: 'card', 'aria-labelledby': 'h-facts' }, h('h2', { id: 'h-facts' }, 'Device'), facts),
      h('section', { class: 'card', 'aria-labelledby': 'h-config' }, h('h2', { id: 'h-config' }, 'Configuration'), config, pulls)),
    h('section', { class: 'card', 'aria-labelledby': 'h-edit' }, h('h2', { id: 'h-edit' }, 'Name, tags and fleet'),
      editForm, editStatus),
    h('section', { class: 'card', 'aria-labelledby': 'h-files' }, h('h2', { id: 'h-files' }, 'Secret files'), files, fileForm, fileStatus),
    h('section', { class: 'card', 'aria-labelledby': 'h-mem' }, h('h2', { id: 'h-mem' }, 'Memory test'),
      memForm, memStatus, progress, h('h3', {}, 'Diagnosis'), diagnosis, h('h3', {}, 'Results'), results),
    h('section', { class: 'card', id: 'terminal', 'aria-labelledby': 'h-term' }, h('h2', { id: 'h-term' }, 'Terminal'),
      h('p', { class: 'muted', id: 'terminal-placeholder' },
        'The browser terminal (WebRTC, peer to peer) is not built yet; its module will mount here.')),
    h('section', { class: 'card', 'aria-labelledby': 'h-events' }, h('h2', { id: 'h-events' }, 'Events'), events));

  function paintDevice() {
    title.textContent = device.name;
    fill(state, badge(device.state, device.online ? 'ok' : 'off'),
      (device.conditions || []).some((c) => c.type === 'MemoryFault') ? badge('Memory fault', 'bad') : null,
      ['rejected', 'failed'].includes(device.configuration?.status) ? configBadge(device.configuration) : null);
    const targets = device.tunnel_targets;
    const sys = device.system || {};
    const fleet = device.fleet_id ? h('a', { href: '/console/fleets', title: device.fleet_id },
      fleetName.get(device.fleet_id) || 'a fleet you cannot see') : 'none';
    fill(facts, dl([
      ['State', device.state], ['Last seen', when(device.last_seen)], ['Boot reason', device.boot_reason],
      ['Fleet', fleet], ['Tags', (device.tags || []).join(', ')],
      ['Firmware', device.firmware], ['Architecture', device.architecture], ['Agent version', device.agent_version],
      ['Uptime', uptime(sys.uptime_seconds)],
      ['IP addresses', sys.ip_addresses && sys.ip_addresses.length ? h('ul', { class: 'plain', id: 'ip-addresses' },
        sys.ip_addresses.map((a) => h('li', {}, h('code', {}, a)))) : null],
      ['CPU', share(sys.cpu_percent)], ['Memory', share(sys.memory_percent, sys.memory_total_bytes)],
      ['Disk', share(sys.disk_percent, sys.disk_total_bytes)],
      ['Facts as of', device.system ? when(sys.at) : h('span', { class: 'muted' }, 'the device has not said')],
      ['Tunnel targets', targets ? [...(targets.names || []), targets.ssh ? 'ssh' : null, targets.shell ? 'shell' : null].filter(Boolean).join(', ') : null],
      ['Device id', h('code', {}, device.id)], ['Created', when(device.created_at)]]));
    const c = device.configuration || {};
    const numbered = (n, vid) => (vid ? h('span', { title: vid }, n === null || n === undefined ? vid : `v${n}`) : null);
    const named = c.config_id ? h('a', { href: '/console/configurations', title: c.config_id },
      nameOf(c.config_id)) : null;
    fill(config, dl([['Configuration', named], ['Assigned version', numbered(c.version, c.version_id)],
      ['Applied version', numbered(c.applied_version, c.applied_version_id)], ['Status', c.status ? configBadge(c) : null],
      ['Error', c.error]]), rejectionOutput(c));
  }

  // The device's own files, then its configuration's files with this device's delivery of each
  // (a device file at the same path overrides the configuration's).
  async function loadFiles() {
    try {
      const own = (await api('GET', `/v1/devices/${id}/secret-files`)).data.map((f) => ({ ...f, from: 'device' }));
      let inherited = [];
      const configId = device.configuration && device.configuration.config_id;
      if (configId) {
        inherited = (await api('GET', `/v1/configurations/${configId}/secret-files`)).data.map((f) => {
          const mine = (f.devices || []).find((d) => d.deviceId === id);
          return { ...f, from: 'configuration', status: mine ? mine.status : 'pending', error: mine ? mine.error : null };
        });
      }
      const list = [...own, ...inherited];
      const tone = (st) => (st === 'on_device' ? 'ok' : st === 'failed' ? 'bad' : st === 'overridden' ? 'off' : 'warn');
      fill(files, list.length ? h('div', { class: 'scroll' }, h('table', { class: 'files' },
        h('thead', {}, h('tr', {}, ['Path', 'From', 'Mode', 'Owner', 'Size', 'SHA-256', 'Updated', 'Delivery'].map((t) => h('th', {}, t)))),
        h('tbody', {}, list.map((f) => h('tr', { dataset: { path: f.path, from: f.from } }, h('td', {}, h('code', {}, f.path)), h('td', {}, f.from),
          h('td', {}, f.mode), h('td', {}, `${f.owner.uid}:${f.owner.gid}`), h('td', {}, bytes(f.size)), h('td', {}, h('code', {}, f.sha256Prefix)),
          h('td', {}, when(f.updatedAt)), h('td', { class: 'delivery' }, badge(f.status, tone(f.status)), f.error ? ` ${f.error}` : ''))))))
        : h('p', { class: 'muted' }, 'No secret files for this device.'));
      return list;
    } catch (err) { fill(files, h('p', { class: 'notice error' }, err.message)); return []; }
  }

  // A delivery has no event of its own: after an upload, look again until nothing is pending (≤ 30 s).
  let watching = null;
  function watchFiles() {
    if (watching) return;
    const until = Date.now() + 30000;
    watching = setInterval(async () => {
      const list = await loadFiles();
      if (Date.now() > until || !list.some((f) => f.status === 'pending')) { clearInterval(watching); watching = null; }
    }, 1000);
  }

  function showProgress(op) {
    const rows = [['Run', op.runId], ['Phase', op.phase ? badge(op.phase, op.phase === 'done' ? 'ok' : ['failed', 'cancelled', 'interrupted'].includes(op.phase) ? 'bad' : 'warn') : null],
      ['Pass', op.pass != null ? `${op.pass} of ${op.passes ?? '?'}` : null], ['Pattern', op.pattern],
      ['Progress', op.progress != null ? percent(op.progress) : null],
      ['Time left', op.etaSeconds != null && op.phase !== 'done' ? duration(op.etaSeconds) : null],
      ['Memory covered', op.coverage != null ? `${percent(op.coverage)} of ${bytes(op.totalBytes)}` : null],
      ['Verified so far', op.testedBytes != null ? `${bytes(op.testedBytes)} (every pattern and pass)` : null],
      ['Rate', fmtRate(op.rate)], ['Errors', op.errors != null ? `${op.errors} (${op.confirmedErrors ?? 0} confirmed)` : null],
      ['Temperature', op.temperature != null ? celsius(op.temperature) : null]];
    if (op.outcome) rows.push(['Outcome', badge(op.outcome, op.outcome === 'pass' ? 'ok' : 'bad')], ['Verdict', op.verdict]);
    // the bar is the share of the planned work done; the memory covered fills within the first sweep
    const bar = op.progress != null ? h('progress', { id: 'memtest-bar', max: 1, value: op.progress, 'aria-label': 'Progress' }) : null;
    fill(progress, h('div', { class: 'progress', dataset: { phase: op.phase || '' } }, bar, dl(rows)));
    if (op.outcome) {
      loadResults(op.runId);
      // the result may set or clear MemoryFault: the condition and the diagnosis are read again (twice:
      // the hub stores the result and the condition just after the outcome event)
      for (const wait of [300, 2000]) {
        setTimeout(() => {
          api('GET', `/v1/devices/${id}`).then((r) => { device = r.data; paintDevice(); }).catch(() => {});
          loadDiagnosis();
        }, wait);
      }
    }
  }

  // The outcome event can come before the hub has stored the result: with ``runId``, look again
  // (every 500 ms, up to 15 s) until that run is among the results.
  async function loadResults(runId, tries = 30) {
    try {
      const list = (await api('GET', `/v1/devices/${id}/memory-test/results?limit=5`)).data.results || [];
      if (runId && tries > 0 && !list.some((r) => r.runId === runId)) {
        setTimeout(() => loadResults(runId, tries - 1), 500);
      }
      fill(results, list.length ? list.map((r) => h('details', { class: 'result', open: r === list[0] },
        h('summary', {}, badge(r.outcome, r.outcome === 'pass' ? 'ok' : 'bad'), ` ${r.plan?.mode || ''} · verdict ${r.verdict} · ${r.errorCount ?? 0} errors · `, when(r.finishedAt)),
        dl([['Summary', r.summary], ['Memory tested', r.totalBytes ? `${bytes(r.coverageBytes)} of ${bytes(r.totalBytes)}` : bytes(r.coverageBytes)],
          ['Verified', `${bytes(r.testedBytes)} (every pattern and pass)`], ['Passes', r.passesCompleted], ['Patterns', (r.patternsRun || []).join(', ')],
          ['Retired pages', (r.retired || []).length], ['Fault', r.fault ? JSON.stringify(r.fault) : 'none']]),
        (r.errors || []).length ? h('table', { class: 'errors' },
          h('thead', {}, h('tr', {}, ['Address', 'Expected', 'Actual', 'Mask', 'Pattern', 'Pass', 'Temp', 'Confirmed'].map((t) => h('th', {}, t)))),
          h('tbody', {}, r.errors.map((e) => h('tr', {}, [e.physAddr, e.expected, e.actual, e.mask, e.pattern, e.pass,
            e.tempMilliC != null && e.tempMilliC >= 0 ? celsius(e.tempMilliC / 1000) : '–', e.confirmed ? 'yes' : 'no'].map((v) => h('td', {}, v)))))) : null))
        : h('p', { class: 'muted' }, 'No results yet.'));
    } catch (err) { fill(results, h('p', { class: 'notice error' }, err.message)); }
  }

  async function loadDiagnosis() {
    try {
      const d = (await api('GET', `/v1/devices/${id}/diagnosis`)).data;
      fill(diagnosis, d.issues && d.issues.length ? h('ul', {}, d.issues.map((i) =>
        h('li', { dataset: { code: i.code || '' } }, badge(i.severity || 'issue', i.severity === 'critical' ? 'bad' : 'warn'),
          ` ${i.title && !(i.message || '').toLowerCase().startsWith(i.title.toLowerCase()) ? `${i.title}: ` : ''}${i.message || i.code || ''}`)))
        : h('p', { class: 'muted' }, 'No issues.'));
    } catch (err) { fill(diagnosis, h('p', { class: 'notice error' }, err.message)); }
  }

  async function loadMemtest() {
    try {
      const m = (await api('GET', `/v1/devices/${id}/memory-test`)).data;
      if (m.supported === false) notice(memStatus, 'This device\'s firmware has no memory test.', 'error');
      if (m.health?.capabilities && m.health.capabilities.offline === false) {
        const boot = memForm.querySelector('input[value=boot]');
        boot.disabled = true;
        boot.parentElement.title = m.health.capabilities.offlineReason || 'test boot unavailable';
      }
      if (m.status?.runId) showProgress({ kind: 'memory_test', runId: m.status.runId, phase: m.status.phase, pass: m.status.pass,
        passes: m.status.passes, pattern: m.status.pattern, rate: m.status.rateBps, errors: m.status.errors,
        confirmedErrors: m.status.confirmedErrors, totalBytes: m.status.totalBytes, testedBytes: m.status.testedBytes,
        etaSeconds: m.status.etaSeconds, progress: m.progress,
        coverage: m.status.totalBytes ? m.status.coverageBytes / m.status.totalBytes : null });
    } catch (err) { notice(memStatus, err.message, 'error'); }
  }

  function logEvent(event) {
    const payload = event.payload && typeof event.payload === 'object' ? JSON.stringify(event.payload) : '';
    events.prepend(h('li', {}, h('code', { class: 'kind' }, event.kind), ' ', when(event.at), ' ', h('span', { class: 'payload' }, payload.slice(0, 300))));
    while (events.children.length > MAX_EVENTS) events.lastChild.remove();
  }

  function onEvent(event) {
    if (event.kind === 'device.snapshot') { device = event.payload; paintDevice(); return; }
    logEvent(event);
    if (event.kind === 'device.state') {
      Object.assign(device, { state: event.payload.state, online: event.payload.online, boot_reason: event.payload.bootReason ?? device.boot_reason });
      if (event.payload.online) device.last_seen = event.at;
      paintDevice();
    } else if (event.kind === 'device.operation' && event.payload?.kind === 'memory_test') {
      showProgress(event.payload);
    } else if (event.kind === 'device.event.container.pull_progress' || event.kind === 'device.event.container.pulled') {
      showPull(event.kind.slice('device.event.'.length), event.payload || {});
    } else if (event.kind === 'device.event.telemetry') {
      api('GET', `/v1/devices/${id}`).then((r) => { device = r.data; paintDevice(); }).catch(() => {});
    } else if (event.kind.startsWith('device.config') || event.kind.startsWith('device.file') || event.kind.includes('secret')) {
      api('GET', `/v1/devices/${id}`).then((r) => { device = r.data; paintDevice(); }).catch(() => {});
      loadFiles();
    }
  }

  mountTerminal(main.querySelector('#terminal'), id);
  paintDevice();
  fillEdit();
  follow(`/v1/devices/${id}/events`, onEvent, (s) => {
    live.textContent = s === 'live' ? '● live' : s === 'refused' ? 'not live' : s === 'paused' ? 'paused while hidden' : 'reconnecting…';
    live.className = s === 'live' ? 'live' : 'muted';
  });
  await Promise.all([loadFiles(), loadMemtest(), loadResults(), loadDiagnosis()]);
}
