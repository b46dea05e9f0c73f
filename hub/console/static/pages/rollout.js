// One rollout, live: its batches and devices follow the rollout's event stream; pause, resume, cancel.
import { api, follow } from '../api.js';
import { fill, h, badge, notice, when } from '../dom.js';
import { rejectionOutput } from '../configstatus.js';

const DONE = new Set(['completed', 'failed', 'cancelled']);

export async function render(main, id) {
  const state = h('span', { id: 'rollout-state' });
  const live = h('span', { id: 'live', class: 'muted' }, 'connecting…');
  const summary = h('div', { id: 'rollout-summary' });
  const batches = h('tbody', { id: 'batches' });
  const devices = h('tbody', { id: 'rollout-devices' });
  const status = h('div', { 'aria-live': 'polite' });
  const control = (verb, label) => h('button', { type: 'button', class: 'secondary', id: `rollout-${verb}`, onclick: async () => {
    try { paint((await api('POST', `/v1/rollouts/${id}/${verb}`)).data); notice(status, `${label}: done.`, 'ok'); } catch (err) {
      notice(status, err.message, 'error');
    }
  } }, label);
  const buttons = [control('pause', 'Pause'), control('resume', 'Resume'), control('cancel', 'Cancel')];
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Rollout'), state, live), h('div', { class: 'row' }, buttons), status, summary,
    h('section', { class: 'card' }, h('h2', {}, 'Batches'), h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {},
      ['Batch', 'Pending', 'In progress', 'Succeeded', 'Failed', 'Other'].map((t) => h('th', {}, t)))), batches))),
    h('section', { class: 'card' }, h('h2', {}, 'Devices'), h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {},
      ['Device', 'Batch', 'Step', 'Error', 'Updated'].map((t) => h('th', {}, t)))), devices))));

  const names = new Map();
  function paint(r) {
    fill(state, badge(r.state, r.state === 'completed' ? 'ok' : r.state === 'failed' || r.state === 'cancelled' ? 'bad' : 'warn'));
    fill(summary, h('p', {}, `${r.total_devices} devices · current batch ${r.current_batch} · batch size ${r.batch_size ?? 'all'}`,
      r.force ? ' · forced (update windows bypassed)' : '', r.reason ? ` · ${r.reason}` : ''));
    fill(batches, ...r.batches.map((b) => {
      const c = b.counts;
      const inProgress = (c.updating || 0) + (c.verifying || 0) + (c.QUEUED_MAINTENANCE || 0);
      const other = Object.entries(c).filter(([k]) => !['pending', 'succeeded', 'failed', 'updating', 'verifying', 'QUEUED_MAINTENANCE'].includes(k))
        .reduce((a, [, v]) => a + v, 0);
      return h('tr', { dataset: { batch: b.batch } }, h('td', {}, `${b.batch}${b.canary ? ' (canary)' : ''}`), h('td', {}, c.pending || 0),
        h('td', {}, inProgress), h('td', { class: 'succeeded' }, c.succeeded || 0), h('td', {}, c.failed || 0), h('td', {}, other));
    }));
    fill(devices, ...r.devices.map((d) => h('tr', {}, h('td', {}, h('a', { href: `/console/devices/${d.device_id}` }, names.get(d.device_id) || d.device_id.slice(0, 8))),
      h('td', {}, d.batch), h('td', {}, badge(d.step, d.step === 'succeeded' ? 'ok' : d.step === 'failed' ? 'bad' : '')), h('td', {}, d.error || '', rejectionOutput({ check_output: d.check_output })), h('td', {}, when(d.updated_at)))));
    for (const b of buttons) b.disabled = DONE.has(r.state);
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
