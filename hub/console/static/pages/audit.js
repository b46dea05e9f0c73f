// The audit log with the API's filters (period, method, path prefix, actor), paged on the server.
// Actors show as the API names them (actorDisplay: an email and the token's description, a service
// account's name, or an id and "(deleted)"); their ids stay in the cell's title.
import { api, query } from '../api.js';
import { fill, h, field, notice, when } from '../dom.js';

export async function render(main) {
  const params = new URLSearchParams(location.search);
  const input = (name, label, type) => field(label, h('input', { name, type: type || 'text', value: params.get(name) || '' }));
  const form = h('form', { id: 'audit-filters', class: 'filters', role: 'search' },
    input('from', 'From', 'datetime-local'), input('to', 'To', 'datetime-local'),
    field('Method', h('select', { name: 'method' }, ['', 'GET', 'POST', 'PUT', 'PATCH', 'DELETE'].map((m) => h('option', { value: m, selected: params.get('method') === m }, m || 'Any')))),
    input('pathPrefix', 'Path prefix'), input('actorUserId', 'Actor user id'), h('button', { type: 'submit' }, 'Apply'));
  const body = h('tbody');
  const pager = h('div', { class: 'pager' });
  const status = h('div', { 'aria-live': 'polite' });
  let page = Number(params.get('page')) || 1;
  form.addEventListener('submit', (ev) => { ev.preventDefault(); page = 1; load(); });
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Audit log')), form, status,
    h('div', { class: 'scroll' }, h('table', { id: 'audit' }, h('thead', {}, h('tr', {},
      ['When', 'Actor', 'Credential', 'Method', 'Path', 'Status', 'Action'].map((t) => h('th', {}, t)))), body)), pager);

  async function load() {
    const f = form.elements;
    const iso = (v) => (v ? new Date(v).toISOString() : '');
    const q = { from: iso(f.from.value), to: iso(f.to.value), method: f.method.value, pathPrefix: f.pathPrefix.value.trim(),
      actorUserId: f.actorUserId.value.trim(), page, limit: 50 };
    history.replaceState(null, '', `/console/audit?${query({ ...q, from: f.from.value, to: f.to.value, limit: '' })}`);
    try {
      const r = await api('GET', `/v1/audit-events?${query(q)}`);
      notice(status, '');
      fill(body, r.data.map((e) => h('tr', {}, h('td', {}, when(e.at)), h('td', { class: 'actor', title: [e.actorUserId, e.credentialId].filter(Boolean).join(' · ') || null }, e.actorDisplay || e.actorType), h('td', {}, e.credentialKind || ''),
        h('td', {}, e.method), h('td', {}, h('code', {}, e.path)), h('td', {}, e.status), h('td', {}, e.action || ''))));
      const p = r.pagination;
      fill(pager, h('button', { type: 'button', class: 'secondary', disabled: page <= 1, onclick: () => { page -= 1; load(); } }, 'Previous'),
        h('span', {}, `Page ${p.page} of ${Math.max(p.totalPages, 1)} · ${p.total} events`),
        h('button', { type: 'button', class: 'secondary', disabled: page >= p.totalPages, onclick: () => { page += 1; load(); } }, 'Next'));
    } catch (err) { notice(status, err.message, 'error'); }
  }
  await load();
}
