// Devices: one server-side page at a time, filters in the address (a reload keeps them), and live
// status over the organisation's event stream. A live change rewrites the cells of its row in
// place: rows are never reordered, added or removed under the pointer; the list moves only when the
// operator pages, filters or presses Refresh.
import { api, follow, query } from '../api.js';
import { fill, h, badge, confirmDialog, field, notice, when } from '../dom.js';
import { configBadge } from '../configstatus.js';
import { addDevicePanel, commandHint } from '../adddevice.js';

const LIMIT = 25;

function stateBadge(device) {
  return badge(device.state, device.online ? 'ok' : 'off');
}

export async function render(main) {
  const params = new URLSearchParams(location.search);
  const filters = {
    search: params.get('search') || '', online: params.get('online') || '', fleet_id: params.get('fleet_id') || '',
    tag: params.get('tag') || '', firmware: params.get('firmware') || '', architecture: params.get('architecture') || '',
    condition: params.get('condition') || '', updating: params.get('updating') || '',
    config_status: params.get('config_status') || '',
  };
  let page = Number(params.get('page')) || 1;
  const [fleets, configs] = await Promise.all([
    api('GET', '/v1/fleets?limit=500').then((r) => r.data).catch(() => []),
    api('GET', '/v1/configurations?limit=100').then((r) => r.data).catch(() => []),
  ]);
  const fleetName = new Map(fleets.map((f) => [f.id, f.name]));
  const configName = new Map(configs.map((c) => [c.id, c.name]));

  const input = (name, label, type) => field(label, h('input', { name, type: type || 'text', value: filters[name] }));
  const select = (name, label, options) => field(label, h('select', { name },
    options.map(([value, text]) => h('option', { value, selected: filters[name] === value }, text))));
  const form = h('form', { class: 'filters', id: 'filters', role: 'search' },
    input('search', 'Search name', 'search'),
    select('online', 'Status', [['', 'Any'], ['true', 'Online'], ['false', 'Offline']]),
    select('fleet_id', 'Fleet', [['', 'Any'], ...fleets.map((f) => [f.id, f.name])]),
    input('tag', 'Tag'), input('firmware', 'Firmware'), input('architecture', 'Architecture'),
    select('condition', 'Condition', [['', 'Any'], ['MemoryFault', 'Memory fault']]),
    select('updating', 'Updating', [['', 'Any'], ['true', 'Updating now'], ['false', 'Not updating']]),
    select('config_status', 'Configuration', [['', 'Any'], ['applied', 'Applied'], ['pending', 'Pending'],
      ['applying', 'Applying'], ['rejected', 'Rejected'], ['failed', 'Failed'], ['none', 'None assigned']]),
    h('button', { type: 'submit' }, 'Apply'));
  form.addEventListener('submit', (ev) => { ev.preventDefault(); readForm(); page = 1; load(); });
  form.addEventListener('change', (ev) => { if (ev.target.tagName === 'SELECT') { readForm(); page = 1; load(); } });
  function readForm() {
    for (const key of Object.keys(filters)) filters[key] = form.elements[key].value.trim();
  }

  const status = h('div', { id: 'devices-status', 'aria-live': 'polite' });
  const live = h('span', { id: 'live', class: 'muted' }, 'connecting…');
  const selectAll = h('input', { type: 'checkbox', 'aria-label': 'Select all on this page' });
  const tbody = h('tbody');
  const table = h('table', { id: 'devices' },
    h('thead', {}, h('tr', {}, h('th', {}, selectAll), h('th', {}, 'Name'), h('th', {}, 'State'),
      h('th', {}, 'Last seen'), h('th', {}, 'Fleet'), h('th', { class: 'wide' }, 'Firmware'),
      h('th', { class: 'wide' }, 'Architecture'), h('th', {}, 'Configuration'), h('th', {}, 'Conditions'))), tbody);
  const pager = h('div', { class: 'pager' });
  const configSelect = h('select', { id: 'bulk-config', 'aria-label': 'Configuration to assign' },
    h('option', { value: '' }, 'Choose a configuration…'), configs.map((c) => h('option', { value: c.id }, c.name)));
  const bulk = h('div', { class: 'bulk', role: 'group', 'aria-label': 'With the selected devices' },
    h('button', { type: 'button', id: 'bulk-reboot', class: 'secondary', onclick: bulkReboot }, 'Reboot selected'),
    configSelect, h('button', { type: 'button', id: 'bulk-assign', class: 'secondary', onclick: bulkAssign }, 'Assign configuration'),
    h('button', { type: 'button', class: 'secondary', onclick: () => load() }, 'Refresh'));
  const adding = addDevicePanel(fleets, () => load());
  const addButton = h('button', { type: 'button', id: 'add-device-open', onclick: () => adding.open() }, 'Add device');
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Devices'), live, addButton), adding.panel, form, bulk, status,
    h('div', { class: 'scroll' }, table), pager);

  const rows = new Map(); // device id -> {row, device, cells}
  selectAll.addEventListener('change', () => {
    for (const { box } of rows.values()) box.checked = selectAll.checked;
  });

  // the configuration by name (one of the first hundred: the list the bulk action offers), then its status
  function configLabel(c) {
    const name = c && c.config_id ? configName.get(c.config_id) : null;
    return name ? h('span', { class: 'config-name', title: c.config_id }, `${name} `) : null;
  }

  function row(device) {
    const box = h('input', { type: 'checkbox', 'aria-label': `Select ${device.name}`, dataset: { id: device.id } });
    const cells = { state: h('td', { class: 'state' }), seen: h('td', { class: 'seen' }) };
    const tr = h('tr', { dataset: { id: device.id } }, h('td', {}, box),
      h('td', {}, h('a', { href: `/console/devices/${device.id}`, class: 'device-name' }, device.name)),
      cells.state, cells.seen, h('td', {}, fleetName.get(device.fleet_id) || ''),
      h('td', { class: 'wide' }, device.firmware || ''), h('td', { class: 'wide' }, device.architecture || ''),
      h('td', { class: 'config' }, configLabel(device.configuration), configBadge(device.configuration)),
      h('td', {}, (device.conditions || []).map((c) => badge(c.type === 'MemoryFault' ? 'Memory fault' : c.type, 'bad'))));
    const entry = { row: tr, device, cells, box };
    paint(entry);
    rows.set(device.id, entry);
    return tr;
  }

  function paint(entry) {
    fill(entry.cells.state, stateBadge(entry.device));
    fill(entry.cells.seen, when(entry.device.last_seen));
  }

  async function load() {
    const q = query({ ...filters, page, limit: LIMIT });
    history.replaceState(null, '', `/console/devices?${query({ ...filters, page: page > 1 ? page : '' })}`);
    try {
      const r = await api('GET', `/v1/devices?${q}`);
      rows.clear();
      selectAll.checked = false;
      fill(tbody, ...r.data.map(row));
      if (!r.data.length) tbody.append(h('tr', {}, h('td', { colspan: 9, class: 'muted' }, filtered() ? 'No devices match.' : emptyHint())));
      const p = r.pagination;
      fill(pager, 
        h('button', { type: 'button', class: 'secondary', disabled: page <= 1, onclick: () => { page -= 1; load(); } }, 'Previous'),
        h('span', { id: 'page-info' }, `Page ${p.page} of ${Math.max(p.totalPages, 1)} · ${p.total} devices`),
        h('button', { type: 'button', class: 'secondary', disabled: page >= p.totalPages, onclick: () => { page += 1; load(); } }, 'Next'));
    } catch (err) {
      notice(status, err.message, 'error');
    }
  }

  function filtered() {
    return Object.values(filters).some(Boolean) || page > 1;
  }

  // A fresh organisation's list: what to do first, rather than an empty table
  function emptyHint() {
    return h('div', { id: 'devices-empty' }, h('p', {}, h('strong', {}, 'No devices yet.'),
      ' Add one: the hub shows its token once, in the command to run on the device:'), commandHint(),
      h('p', {}, h('button', { type: 'button', onclick: () => adding.open() }, 'Add device')));
  }

  function selected() {
    return [...rows.values()].filter((e) => e.box.checked).map((e) => e.device);
  }

  async function each(devices, action, verb) {
    let ok = 0;
    const failed = [];
    for (const d of devices) {
      try { await action(d); ok += 1; } catch (err) { failed.push(`${d.name}: ${err.message}`); }
    }
    notice(status, `${verb}: ${ok} of ${devices.length} done.${failed.length ? ` Failed: ${failed.join('; ')}` : ''}`,
      failed.length ? 'error' : 'ok');
  }

  async function bulkReboot() {
    const devices = selected();
    if (!devices.length) { notice(status, 'Select devices first.', 'error'); return; }
    if (!await confirmDialog('Reboot devices', `Reboot ${devices.length} device(s) now?`, 'Reboot')) return;
    await each(devices, (d) => api('POST', `/v1/devices/${d.id}/reboot`), 'Reboot');
  }

  async function bulkAssign() {
    const devices = selected();
    if (!devices.length || !configSelect.value) { notice(status, 'Select devices and a configuration first.', 'error'); return; }
    await each(devices, (d) => api('PUT', `/v1/devices/${d.id}/configuration`, { configId: configSelect.value }), 'Assign');
  }

  function onEvent(event) {
    const entry = rows.get(event.deviceId);
    if (!entry) return;
    if (event.kind === 'device.state') {
      Object.assign(entry.device, { state: event.payload.state, online: event.payload.online });
      if (event.payload.online) entry.device.last_seen = event.at;
      paint(entry);
      entry.row.classList.add('changed');
      setTimeout(() => entry.row.classList.remove('changed'), 1500);
    }
  }

  let poll = null;
  let connected = false;
  follow('/console/api/events', onEvent, (state) => {
    live.textContent = state === 'live' ? '● live' : state === 'refused' ? 'refreshing every 15 s'
      : state === 'paused' ? 'paused while hidden' : 'reconnecting…';
    live.className = state === 'live' ? 'live' : 'muted';
    // back after a gap (hidden tab, lost connection): what changed meanwhile sent no event to us
    if (state === 'live' && connected) refreshInPlace();
    if (state === 'live') connected = true;
    // without the organisation-wide stream (access to some fleets only): refresh the same page in place
    if (state === 'refused' && !poll) poll = setInterval(refreshInPlace, 15000);
  });

  async function refreshInPlace() {
    try {
      const r = await api('GET', `/v1/devices?${query({ ...filters, page, limit: LIMIT })}`);
      for (const d of r.data) {
        const entry = rows.get(d.id);
        if (entry) { entry.device = d; paint(entry); }
      }
    } catch { /* the next round tries again */ }
  }

  const deleted = params.get('deleted');
  if (deleted) notice(status, `${deleted} is deleted: its token no longer works.`, 'ok');
  await load();
}
