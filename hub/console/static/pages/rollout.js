// One rollout, live: its batches and devices follow the rollout's event stream; pause, resume, cancel.
import { api, follow } from '../api.js';
import { fill, h, badge, confirmDialog, notice, when } from '../dom.js';
import { localTime, percent } from '../format.js';
import { rejectionOutput } from '../configstatus.js';

// Which controls each rollout state accepts (actors/machines/rollout.py TRANSITIONS): a button is
// enabled only where its event moves the rollout; the hub answers any other with 409 invalid_state.
export const CONTROLS = {
  pending: ['cancel'],
  running: ['pause', 'cancel'],
  paused: ['resume', 'cancel'],
  completed: [],
  failed: [],
  cancelled: [],
};

const IN_PROGRESS = ['updating', 'verifying'];
const WAITING = 'QUEUED_MAINTENANCE';

// "waiting for update window until <the viewer's local time>" (the window's next opening)
export function waitingText(until) {
  return until ? `waiting for update window until ${localTime(until)}` : 'waiting for update window (opening now)';
}

export function configLabel(r) {
  const name = r.config_name ?? r.config_id;
  return r.version_number != null ? `${name} v${r.version_number}` : name;
}

export function fleetsLabel(r) {
  return (r.fleets || []).map((f) => f.name ?? f.id).join(', ');
}

export async function render(main, id) {
  const title = h('h1', {}, 'Rollout');
  const state = h('span', { id: 'rollout-state' });
  const live = h('span', { id: 'live', class: 'muted' }, 'connecting…');
  const summary = h('div', { id: 'rollout-summary' });
  const batches = h('tbody', { id: 'batches' });
  const devices = h('tbody', { id: 'rollout-devices' });
  const status = h('div', { 'aria-live': 'polite' });
  const control = (verb, label) => h('button', { type: 'button', class: verb === 'cancel' ? 'danger' : 'secondary', id: `rollout-${verb}`, onclick: async () => {
    if (verb === 'cancel' && !await confirmDialog('Cancel the rollout',
      'No more devices will be updated. Devices already updating finish; the others keep the version they run. A cancelled rollout cannot be resumed.',
      'Cancel the rollout')) return;
    try { paint((await api('POST', `/v1/rollouts/${id}/${verb}`)).data); notice(status, `${label}: done.`, 'ok'); } catch (err) {
      notice(status, err.message, 'error');
    }
  } }, label);
  const buttons = { pause: control('pause', 'Pause'), resume: control('resume', 'Resume'), cancel: control('cancel', 'Cancel') };
  fill(main, h('div', { class: 'title' }, title, state, live), h('div', { class: 'row' }, Object.values(buttons)), status, summary,
    h('section', { class: 'card' }, h('h2', {}, 'Batches'), h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {},
      ['Batch', 'Pending', 'Waiting for window', 'In progress', 'Succeeded', 'Failed', 'Other'].map((t) => h('th', {}, t)))), batches))),
    h('section', { class: 'card' }, h('h2', {}, 'Devices'), h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {},
      ['Device', 'Batch', 'Step', 'Error', 'Updated'].map((t) => h('th', {}, t)))), devices))));

  const names = new Map();
  function paint(r) {
    fill(title, `Rollout of ${configLabel(r)}`);
    fill(state, badge(r.state, r.state === 'completed' ? 'ok' : r.state === 'failed' || r.state === 'cancelled' ? 'bad' : 'warn'));
    const waiting = r.waiting_for_window || { devices: 0 };
    fill(summary, h('p', {}, `Configuration ${configLabel(r)} · fleets ${fleetsLabel(r)}`),
      h('p', {}, `${r.total_devices} devices · current batch ${r.current_batch} · batch size ${r.batch_size ?? 'all'}`,
        ` · success threshold ${percent(r.success_threshold, 0)} · failure threshold ${percent(r.failure_threshold, 0)}`,
        r.force ? ' · forced (update windows bypassed)' : '', r.reason ? ` · ${r.reason}` : ''),
      waiting.devices ? h('p', { id: 'rollout-waiting' }, badge('waiting', 'warn'),
        ` ${waiting.devices} device${waiting.devices === 1 ? '' : 's'} ${waitingText(waiting.until)}`) : null);
    fill(batches, ...r.batches.map((b) => {
      const c = b.counts;
      const inProgress = IN_PROGRESS.reduce((a, k) => a + (c[k] || 0), 0);
      const other = Object.entries(c).filter(([k]) => !['pending', 'succeeded', 'failed', WAITING, ...IN_PROGRESS].includes(k))
        .reduce((a, [, v]) => a + v, 0);
      return h('tr', { dataset: { batch: b.batch } }, h('td', {}, `${b.batch}${b.canary ? ' (canary)' : ''}`), h('td', {}, c.pending || 0),
        h('td', { class: 'waiting' }, c[WAITING] || 0), h('td', { class: 'in-progress' }, inProgress),
        h('td', { class: 'succeeded' }, c.succeeded || 0), h('td', {}, c.failed || 0), h('td', {}, other));
    }));
    fill(devices, ...r.devices.map((d) => h('tr', { dataset: { device: d.device_id } },
      h('td', {}, h('a', { href: `/console/devices/${d.device_id}` }, names.get(d.device_id) || d.device_id.slice(0, 8))),
      h('td', {}, d.batch),
      h('td', {}, d.step === WAITING ? badge(waitingText(d.waiting_for_window_until), 'warn')
        : badge(d.step, d.step === 'succeeded' ? 'ok' : d.step === 'failed' ? 'bad' : '')),
      h('td', {}, d.error || '', rejectionOutput({ check_output: d.check_output })), h('td', {}, when(d.updated_at)))));
    const allowed = CONTROLS[r.state] || [];
    for (const [verb, b] of Object.entries(buttons)) {
      b.disabled = !allowed.includes(verb);
      b.title = b.disabled ? `not while the rollout is ${r.state}` : '';
    }
  }

  const first = (await api('GET', `/v1/rollouts/${id}`)).data;
  await Promise.all(first.devices.slice(0, 200).map((d) => api('GET', `/v1/devices/${d.device_id}`)
    .then((x) => names.set(d.device_id, x.data.name)).catch(() => {})));
  paint(first);

  // Each event says something moved; the rollout's whole status is read again, at most every 300 ms.
  let timer = null;
  follow(`/v1/rollouts/${id}/events`, (event) => {
    if (event.kind === 'rollout.snapshot') { paint(event.payload); return; }
    if (timer) return;
    timer = setTimeout(async () => {
      timer = null;
      try { paint((await api('GET', `/v1/rollouts/${id}`)).data); } catch { /* next event tries again */ }
    }, 300);
  }, (s) => { live.textContent = s === 'live' ? '● live' : s === 'refused' ? 'not live' : s === 'paused' ? 'paused while hidden' : 'reconnecting…'; live.className = s === 'live' ? 'live' : 'muted'; });
}
