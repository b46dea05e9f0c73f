// Webhooks (organisation admins, docs/events.md): the endpoints with their health, a form that shows
// a new endpoint's signing secret once, and per endpoint its delivery log, a ping, a redelivery of a
// range of events, enable/disable and delete.
import { api, query } from '../api.js';
import { fill, h, badge, confirmDialog, field, notice, when } from '../dom.js';

function health(w) {
  if (!w.enabled) return badge('disabled', 'bad');
  if (w.health.failingAttempts) return badge(`failing (${w.health.failingAttempts})`, 'warn');
  return badge('healthy', 'ok');
}

export async function render(main) {
  const status = h('div', { 'aria-live': 'polite' });
  const secretBox = h('div', { 'aria-live': 'polite' });
  const url = h('input', { name: 'url', id: 'webhook-url', type: 'url', required: true, placeholder: 'https://example.com/fleethub' });
  const types = h('input', { name: 'types', id: 'webhook-types', value: 'io.fleethub.*', required: true });
  const form = h('form', { id: 'webhook-create', class: 'card' }, h('h2', {}, 'New endpoint'),
    h('div', { class: 'row' }, field('URL', url), field('Event types', types, 'comma-separated; a prefix may end in *')),
    h('button', { type: 'submit' }, 'Add endpoint'), secretBox);
  const list = h('tbody');
  const detail = h('section', { class: 'card', id: 'webhook-detail', hidden: true });
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Webhooks')), status, form,
    h('section', { class: 'card' }, h('h2', {}, 'Endpoints'), h('div', { class: 'scroll' }, h('table', { id: 'webhooks' },
      h('thead', {}, h('tr', {}, ['URL', 'Health', 'Failing since', 'Next attempt', 'Last event handled', 'Why disabled', ''].map((t) => h('th', {}, t)))), list))),
    detail);

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const r = await api('POST', '/v1/webhooks', { url: url.value.trim(), event_types: types.value.split(',').map((t) => t.trim()).filter(Boolean) });
      fill(secretBox, h('p', { class: 'notice' }, 'Signing secret (shown this once; keep it): ', h('code', { id: 'webhook-secret' }, r.data.secret)));
      form.reset();
      await load();
    } catch (err) { notice(secretBox, err.message, 'error'); }
  });

  async function act(label, fn) {
    try { await fn(); notice(status, label); await load(); } catch (err) { notice(status, err.message, 'error'); }
  }

  async function show(w) {
    detail.hidden = false;
    const log = h('tbody');
    const from = h('input', { type: 'number', min: 1, name: 'from', id: 'redeliver-from' });
    const to = h('input', { type: 'number', min: 1, name: 'to', id: 'redeliver-to' });
    const result = h('div', { 'aria-live': 'polite' });
    const redeliver = h('form', { id: 'webhook-redeliver', class: 'row' }, field('From event', from), field('To event', to),
      h('button', { type: 'submit' }, 'Redeliver'));
    redeliver.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      try {
        const r = await api('POST', `/v1/webhooks/${w.id}/redeliver`, { from: Number(from.value), to: to.value ? Number(to.value) : undefined });
        notice(result, `${r.data.delivered} of ${r.data.sent} delivered`);
        await loadLog();
      } catch (err) { notice(result, err.message, 'error'); }
    });
    const ping = h('button', { type: 'button', class: 'secondary', id: 'webhook-ping', onclick: async () => {
      try {
        const r = await api('POST', `/v1/webhooks/${w.id}/test`);
        notice(result, r.data.ok ? `ping answered ${r.data.status} in ${r.data.latencyMs} ms` : `ping failed: ${r.data.error}`, r.data.ok ? '' : 'error');
        await loadLog();
      } catch (err) { notice(result, err.message, 'error'); }
    } }, 'Send a ping');
    fill(detail, h('h2', {}, 'Deliveries to ', h('code', {}, w.url)), h('div', { class: 'row' }, ping), redeliver, result,
      h('div', { class: 'scroll' }, h('table', { id: 'webhook-deliveries' }, h('thead', {}, h('tr', {},
        ['When', 'Event', 'Type', 'Attempt', 'Status', 'Latency', 'Answer', 'Error'].map((t) => h('th', {}, t)))), log)));
    async function loadLog() {
      const r = await api('GET', `/v1/webhooks/${w.id}/deliveries?${query({ limit: 100 })}`);
      fill(log, r.data.map((d) => h('tr', { class: d.ok ? '' : 'failed' }, h('td', {}, when(d.at)), h('td', {}, d.sequence ?? '–'),
        h('td', {}, d.type), h('td', {}, d.manual ? `${d.attempt} (asked)` : d.attempt), h('td', {}, d.status ?? '–'),
        h('td', {}, `${d.latencyMs} ms`), h('td', {}, h('code', {}, d.responseExcerpt.slice(0, 120))), h('td', {}, d.error || ''))));
      if (!r.data.length) log.append(h('tr', {}, h('td', { colspan: 8, class: 'muted' }, 'No deliveries yet.')));
    }
    await loadLog();
  }

  async function load() {
    const r = await api('GET', '/v1/webhooks');
    fill(list, r.data.map((w) => h('tr', { dataset: { id: w.id } },
      h('td', {}, h('a', { href: '#webhook-detail', onclick: () => show(w) }, w.url)), h('td', {}, health(w)),
      h('td', {}, w.health.failingSince ? when(w.health.failingSince) : ''), h('td', {}, w.health.nextAttemptAt ? when(w.health.nextAttemptAt) : ''),
      h('td', {}, w.cursor), h('td', {}, w.disabledReason || ''),
      h('td', {}, h('button', { type: 'button', class: 'secondary', onclick: () => act(w.enabled ? 'Disabled.' : 'Enabled.',
        () => api('PATCH', `/v1/webhooks/${w.id}`, { enabled: !w.enabled })) }, w.enabled ? 'Disable' : 'Enable'), ' ',
      h('button', { type: 'button', class: 'danger', onclick: async () => {
        if (await confirmDialog('Delete endpoint', `Stop sending events to ${w.url} and forget its delivery log?`, 'Delete')) {
          await act('Deleted.', () => api('DELETE', `/v1/webhooks/${w.id}`));
        }
      } }, 'Delete')))));
    if (!r.data.length) list.append(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No endpoints yet.')));
  }
  try { await load(); } catch (err) { notice(status, err.message, 'error'); }
}
