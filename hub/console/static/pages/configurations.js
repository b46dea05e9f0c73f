// Configurations: create, versions, a line diff between two versions, and secret files (write-only:
// the content is sent once and never shown; metadata and delivery per device are). Versions show as
// their numbers, and a configuration's fleets by name.
import { api, query } from '../api.js';
import { fill, h, badge, bytes, field, notice, when } from '../dom.js';

// Lines of a and b as a list of [' '|'-'|'+', line] by longest common subsequence (specs are small).
export function diffLines(a, b) {
  const n = a.length, m = b.length;
  const lcs = Array.from({ length: n + 1 }, () => new Int32Array(m + 1));
  for (let i = n - 1; i >= 0; i -= 1) for (let j = m - 1; j >= 0; j -= 1) {
    lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  }
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push([' ', a[i]]); i += 1; j += 1; } else if (lcs[i + 1][j] >= lcs[i][j + 1]) { out.push(['-', a[i]]); i += 1; } else { out.push(['+', b[j]]); j += 1; }
  }
  while (i < n) { out.push(['-', a[i]]); i += 1; }
  while (j < m) { out.push(['+', b[j]]); j += 1; }
  return out;
}

const pretty = (spec) => JSON.stringify(spec, null, 2).split('\n');

export async function render(main) {
  const list = h('tbody');
  const detail = h('section', { class: 'card', id: 'config-detail', hidden: true });
  const status = h('div', { 'aria-live': 'polite' });
  const name = h('input', { name: 'name', required: true });
  const spec = h('textarea', { name: 'spec', rows: 4, spellcheck: 'false', value: '{\n  "workload": {"command": ["sleep", "infinity"]}\n}' });
  const create = h('form', { id: 'config-create', class: 'card' }, h('h2', {}, 'New configuration'), field('Name', name), field('Spec (JSON)', spec),
    h('button', { type: 'submit' }, 'Create'));
  create.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const r = await api('POST', '/v1/configurations', { name: name.value, spec: JSON.parse(spec.value) });
      name.value = '';
      await load();
      await open(r.data.id);
    } catch (err) { notice(status, err.message, 'error'); }
  });
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Configurations')), status,
    h('section', { class: 'card' }, h('div', { class: 'scroll' }, h('table', { id: 'configurations' }, h('thead', {}, h('tr', {},
      ['Name', 'Version', 'Devices', 'Secret files', 'Updated'].map((t) => h('th', {}, t)))), list))), detail, create);

  async function load() {
    const r = await api('GET', `/v1/configurations?${query({ limit: 100, sortBy: 'name', sortOrder: 'asc' })}`);
    fill(list, r.data.map((c) => h('tr', { dataset: { id: c.id } },
      h('td', {}, h('button', { type: 'button', class: 'link', onclick: () => open(c.id) }, c.name)), h('td', {}, c.currentVersion),
      h('td', {}, c.deviceCount), h('td', {}, c.secretFileCount), h('td', {}, when(c.updatedAt)))));
    if (!r.data.length) list.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No configurations yet.')));
  }

  async function open(id) {
    const config = (await api('GET', `/v1/configurations/${id}`)).data;
    const versions = (await api('GET', `/v1/configurations/${id}/versions?limit=100`)).data.sort((x, y) => y.version - x.version);
    // The fleets list has no configuration filter: the first 500 the caller may view, by their config_id.
    const fleets = await api('GET', '/v1/fleets?limit=500').then((r) => r.data.filter((f) => f.config_id === id).map((f) => f.name), () => []);
    const pick = (nameAttr, index) => h('select', { name: nameAttr, 'aria-label': nameAttr },
      versions.map((v, i) => h('option', { value: v.id, selected: i === index }, `v${v.version} · ${new Date(v.createdAt).toLocaleString()}`)));
    const from = pick('from', Math.min(1, versions.length - 1));
    const to = pick('to', 0);
    const diff = h('pre', { id: 'version-diff', class: 'diff' });
    const showDiff = () => {
      const a = versions.find((v) => v.id === from.value), b = versions.find((v) => v.id === to.value);
      fill(diff, diffLines(pretty(a.spec), pretty(b.spec)).map(([op, line]) => h('span', { class: `d${op === '+' ? 'add' : op === '-' ? 'del' : ''}` }, `${op} ${line}\n`)));
    };
    from.addEventListener('change', showDiff);
    to.addEventListener('change', showDiff);
    const newSpec = h('textarea', { name: 'spec', rows: 6, spellcheck: 'false', value: JSON.stringify(versions[0]?.spec ?? {}, null, 2) });
    const msg = h('div', { 'aria-live': 'polite' });
    const versionForm = h('form', { id: 'version-create' }, field('New version (JSON spec)', newSpec), h('button', { type: 'submit' }, 'Save as new version'));
    versionForm.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      try { await api('POST', `/v1/configurations/${id}/versions`, { spec: JSON.parse(newSpec.value) }); await open(id); } catch (err) { notice(msg, err.message, 'error'); }
    });
    const files = h('div', { id: 'config-secret-files' });
    const path = h('input', { name: 'path', required: true, placeholder: '/etc/app/secret.key', spellcheck: 'false' });
    const mode = h('input', { name: 'mode', value: '0600', size: 5 });
    const upload = h('input', { type: 'file', name: 'file', required: true });
    const fileMsg = h('div', { 'aria-live': 'polite' });
    const fileForm = h('form', { id: 'config-secret-upload', class: 'row' }, field('Path on the device', path), field('Mode', mode), field('File (write-only)', upload),
      h('button', { type: 'submit' }, 'Upload'));
    fileForm.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const raw = new Uint8Array(await upload.files[0].arrayBuffer());
      let binary = '';
      for (const b of raw) binary += String.fromCharCode(b);
      try {
        await api('POST', `/v1/configurations/${id}/secret-files`, { path: path.value, mode: mode.value, content_base64: btoa(binary) });
        upload.value = '';
        notice(fileMsg, 'Uploaded; its content will not be shown again.', 'ok');
        await loadFiles();
      } catch (err) { notice(fileMsg, err.message, 'error'); }
    });
    async function loadFiles() {
      const list2 = (await api('GET', `/v1/configurations/${id}/secret-files`)).data;
      fill(files, list2.length ? h('table', {}, h('thead', {}, h('tr', {}, ['Path', 'Mode', 'Size', 'SHA-256', 'Updated', 'Delivery'].map((t) => h('th', {}, t)))),
        h('tbody', {}, list2.map((f) => h('tr', {}, h('td', {}, h('code', {}, f.path)), h('td', {}, f.mode), h('td', {}, bytes(f.size)),
          h('td', {}, h('code', {}, f.sha256Prefix)), h('td', {}, when(f.updatedAt)),
          h('td', {}, badge(f.status, f.status === 'on_device' ? 'ok' : f.status === 'failed' ? 'bad' : 'warn'),
            ` ${Object.entries(f.deliveries).filter(([, v]) => v).map(([k, v]) => `${v} ${k}`).join(', ')}`,
            Object.values(f.deliveries).some((v) => v) ? perDevice(f) : null)))))
        : h('p', { class: 'muted' }, 'No secret files.'));
    }
    // Every device's delivery of one file, a page at a time (failed first), loaded when opened: a
    // configuration on thousands of devices lists them all, not the first 100 the list answer holds.
    function perDevice(f) {
      const items = h('ul', {});
      const more = h('button', { type: 'button', class: 'link', hidden: true }, 'More');
      const filter = h('select', { name: 'status', 'aria-label': 'delivery status' },
        h('option', { value: '' }, 'every status'), ['failed', 'pending', 'on_device', 'overridden'].map((v) => h('option', { value: v }, v)));
      const shown = h('span', { class: 'muted' });
      let page = 0;
      async function next(reset) {
        if (reset) { page = 0; fill(items); }
        page += 1;
        const q = query({ page, limit: 100, ...(filter.value ? { status: filter.value } : {}) });
        try {
          const r = await api('GET', `/console/api/configurations/${id}/secret-files/${f.id}/devices?${q}`);
          items.append(...r.data.map((d) => h('li', {}, h('a', { href: `/console/devices/${d.deviceId}` }, d.name),
            ' ', badge(d.status, d.status === 'on_device' ? 'ok' : d.status === 'failed' ? 'bad' : 'warn'), d.error ? ` ${d.error}` : '')));
          more.hidden = page >= r.pagination.totalPages;
          shown.textContent = ` ${items.children.length} of ${r.pagination.total}`;
        } catch (err) { notice(fileMsg, err.message, 'error'); }
      }
      more.addEventListener('click', () => next(false));
      filter.addEventListener('change', () => next(true));
      const box = h('details', { class: 'per-device', dataset: { file: f.id } }, h('summary', {}, 'per device'), filter, shown, items, more);
      box.addEventListener('toggle', () => { if (box.open && page === 0) next(true); });
      return box;
    }
    fill(detail, h('h2', {}, config.name), h('p', { class: 'muted' }, config.description || ''),
      h('p', { id: 'config-facts' }, `Current version v${config.currentVersion} · `, fleets.length ? `fleets: ${fleets.join(', ')}` : 'no fleet uses it'),
      h('h3', {}, 'Versions'), versions.length > 1 ? h('div', { class: 'row' }, field('From', from), field('To', to)) : null,
      diff, versionForm, msg, h('h3', {}, 'Secret files'), files, fileForm, fileMsg);
    detail.hidden = false;
    if (versions.length) showDiff();
    await loadFiles();
  }

  await load();
}
