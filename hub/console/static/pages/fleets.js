// Fleets and their update windows: an editor with a time-zone picker, and the window check showing the
// next opening in the fleet's zone and in the viewer's local time.
import { api } from '../api.js';
import { fill, h, badge, confirmDialog, field, notice, when } from '../dom.js';

const DAYS = ['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday'];

// Days as a reader says them: every day, Mon–Fri, Sat, Sun, or a list (Mon, Wed, Fri).
function dayList(days) {
  const on = DAYS.map((d) => days.includes(d));
  if (on.every(Boolean)) return 'every day';
  const short = (i) => DAYS[i].slice(0, 3);
  const runs = [];
  for (let i = 0; i < 7; i += 1) {
    if (!on[i]) continue;
    let j = i;
    while (j + 1 < 7 && on[j + 1]) j += 1;
    runs.push(j - i >= 2 ? `${short(i)}–${short(j)}` : j > i ? `${short(i)}, ${short(j)}` : short(i));
    i = j;
  }
  return runs.join(', ');
}

// The fleets list's "Update window" column: days, hours and zone, or "always" where nothing holds updates back.
export function windowText(w) {
  if (!w || !w.enabled) return 'always';
  const hours = w.start_time === w.end_time ? 'all day' : `${w.start_time}–${w.end_time}`;
  return `${dayList(w.days_of_week || [])} ${hours} (${w.timezone})`;
}

function zones() {
  try { return Intl.supportedValuesOf('timeZone'); } catch { return ['UTC']; }
}

function inZone(instant, zone) {
  return new Intl.DateTimeFormat(undefined, { timeZone: zone, dateStyle: 'full', timeStyle: 'short' }).format(new Date(instant));
}

export async function render(main) {
  const list = h('tbody');
  const editor = h('section', { class: 'card', id: 'window-editor', hidden: true });
  const name = h('input', { name: 'name', required: true, maxlength: 200 });
  const status = h('div', { 'aria-live': 'polite' });
  const create = h('form', { id: 'fleet-create', class: 'row' }, field('New fleet', name), h('button', { type: 'submit' }, 'Create fleet'));
  create.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try { await api('POST', '/v1/fleets', { name: name.value }); name.value = ''; await load(); } catch (err) { notice(status, err.message, 'error'); }
  });
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Fleets')), create, status,
    h('section', { class: 'card' }, h('div', { class: 'scroll' }, h('table', { id: 'fleets' }, h('thead', {}, h('tr', {},
      ['Fleet', 'Devices', 'Architecture', 'Tags', 'Update window', ''].map((t) => h('th', {}, t)))), list))), editor);

  async function load() {
    const fleets = (await api('GET', '/v1/fleets?limit=500')).data;
    fill(list, fleets.map((f) => h('tr', { dataset: { id: f.id } }, h('td', {}, f.name), h('td', {}, f.device_count ?? ''),
      h('td', {}, f.architecture || ''), h('td', {}, (f.tags || []).join(', ')), h('td', { class: 'window' }, windowText(f.update_window)),
      h('td', {}, h('button', { type: 'button', class: 'secondary', onclick: () => edit(f) }, 'Edit')))));
    if (!fleets.length) list.append(h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No fleets yet.')));
  }

  async function edit(fleet) {
    const w = (await api('GET', `/v1/fleets/${fleet.id}/update-window`)).data;
    const configs = (await api('GET', '/v1/configurations?limit=100')).data;
    // the fleet itself: name, tags, architecture (devices must match to be eligible), configuration
    const fName = h('input', { name: 'name', value: fleet.name, required: true, maxlength: 200 });
    const fTags = h('input', { name: 'tags', value: (fleet.tags || []).join(', '), placeholder: 'comma separated' });
    const fArch = h('input', { name: 'architecture', value: fleet.architecture || '', maxlength: 64 });
    const fConfig = h('select', { name: 'config_id' }, h('option', { value: '' }, 'none'),
      configs.map((c) => h('option', { value: c.id, selected: c.id === fleet.config_id }, c.name)));
    const fDesc = h('textarea', { name: 'description', maxlength: 2000, rows: 2 });
    fDesc.value = fleet.description || '';
    // devices of this fleet pull images through the hub's registry proxy (billing counts the fallbacks)
    const fProxy = h('input', { type: 'checkbox', name: 'registry_proxy', checked: !!fleet.registry_proxy });
    // with it on: from the registry first and the hub when that fails, or through the hub only
    const fMode = h('select', { name: 'registry_proxy_mode' },
      [['fallback', 'when the registry fails'], ['always', 'always (never the registry itself)']].map(([v, label]) =>
        h('option', { value: v, selected: v === (fleet.registry_proxy_mode || 'fallback') }, label)));
    const fMsg = h('div', { 'aria-live': 'polite' });
    const fleetForm = h('form', { id: 'fleet-form' }, h('div', { class: 'row' }, field('Name', fName), field('Tags', fTags),
      field('Architecture', fArch), field('Configuration', fConfig)), field('Description', fDesc),
      h('label', { class: 'radio' }, fProxy, ' Registry proxy'), field('Pull through the hub', fMode),
      h('button', { type: 'submit' }, 'Save fleet'), fMsg);
    fleetForm.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const body = { name: fName.value.trim(), tags: fTags.value.split(',').map((t) => t.trim()).filter(Boolean),
        architecture: fArch.value.trim() || null, config_id: fConfig.value || null,
        description: fDesc.value, registry_proxy: fProxy.checked, registry_proxy_mode: fMode.value };
      try {
        Object.assign(fleet, (await api('PATCH', `/v1/fleets/${fleet.id}`, body)).data);
        notice(fMsg, 'Saved.', 'ok');
        await load();
      } catch (err) { notice(fMsg, err.message, 'error'); }
    });
    const local = Intl.DateTimeFormat().resolvedOptions().timeZone;
    const enabled = h('input', { type: 'checkbox', name: 'enabled', checked: w.enabled });
    const zone = h('input', { name: 'timezone', list: 'zones', value: w.timezone || local, required: true, spellcheck: 'false' });
    const start = h('input', { type: 'time', name: 'start_time', value: w.start_time || '22:00', required: true });
    const end = h('input', { type: 'time', name: 'end_time', value: w.end_time || '04:00', required: true });
    const days = DAYS.map((d) => h('label', { class: 'radio' }, h('input', { type: 'checkbox', name: 'day', value: d, checked: (w.days_of_week || DAYS).includes(d) }), ` ${d}`));
    const check = h('div', { id: 'window-check', 'aria-live': 'polite' });
    const msg = h('div', { 'aria-live': 'polite' });
    const form = h('form', { id: 'window-form' }, h('label', { class: 'radio' }, enabled, ' Window in force (off: updates any time)'),
      h('div', { class: 'row' }, field('Time zone (IANA)', zone), field('Opens', start), field('Closes', end, 'before the opening: crosses midnight')),
      h('fieldset', {}, h('legend', {}, 'Days it opens on'), days),
      h('datalist', { id: 'zones' }, zones().map((z) => h('option', { value: z }))),
      h('div', { class: 'row' }, h('button', { type: 'submit' }, 'Save window'),
        h('button', { type: 'button', class: 'secondary', onclick: () => showCheck() }, 'Check now')), msg, check);
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const body = { enabled: enabled.checked, timezone: zone.value.trim(), start_time: start.value.slice(0, 5), end_time: end.value.slice(0, 5),
        days_of_week: days.map((l) => l.firstChild).filter((b) => b.checked).map((b) => b.value) };
      try {
        const saved = (await api('PUT', `/v1/fleets/${fleet.id}/update-window`, body)).data;
        notice(msg, 'Saved.', 'ok');
        paintCheck(saved.check, saved.timezone);
        await load();
      } catch (err) { notice(msg, err.message, 'error'); }
    });
    async function showCheck() {
      try { paintCheck((await api('GET', `/v1/fleets/${fleet.id}/update-window/check`)).data, zone.value.trim()); } catch (err) { notice(msg, err.message, 'error'); }
    }
    function paintCheck(c, tz) {
      fill(check, c.allowed ? h('p', {}, badge('open', 'ok'), ' Updates are allowed now.')
        : h('div', {}, h('p', {}, badge('closed', 'warn'), ' Updates wait for the next opening:'),
          h('dl', { class: 'facts' }, h('dt', {}, `In ${tz}`), h('dd', { id: 'next-in-zone' }, inZone(c.next_window_at, tz)),
            h('dt', {}, `Your time (${local})`), h('dd', { id: 'next-local' }, inZone(c.next_window_at, local)),
            h('dt', {}, 'UTC'), h('dd', {}, when(c.next_window_at)))));
    }
    // Revert: a rollout of what the fleet ran before its newest rollout (the hub picks the version),
    // with a rollout's gates; "force" goes through a closed window, as a forced rollout does.
    const rForce = h('input', { type: 'checkbox', name: 'force' });
    const rMsg = h('div', { 'aria-live': 'polite' });
    const rButton = h('button', { type: 'button', class: 'danger', id: 'fleet-revert' }, 'Revert fleet');
    rButton.addEventListener('click', async () => {
      if (!await confirmDialog('Revert fleet', `Roll ${fleet.name} back to what it ran before its newest rollout?`, 'Revert')) return;
      try {
        const ro = (await api('POST', `/v1/fleets/${fleet.id}/revert`, { force: rForce.checked })).data;
        notice(rMsg, h('span', {}, `Reverting to v${ro.revert.to_version}: `, h('a', { href: `/console/rollouts/${ro.id}` }, `rollout ${ro.id.slice(0, 8)}`)), 'ok');
      } catch (err) { notice(rMsg, err.message, 'error'); }
    });
    const revertBlock = h('div', { id: 'fleet-revert-block' }, h('p', { class: 'muted' }, 'Back to what the fleet ran before its newest rollout (cancel a running rollout first).'),
      h('div', { class: 'row' }, rButton, h('label', { class: 'radio' }, rForce, ' Ignore the update window')), rMsg);
    fill(editor, h('h2', {}, `Fleet: ${fleet.name}`), fleetForm, h('h3', {}, 'Update window'), form, h('h3', {}, 'Revert'), revertBlock);
    editor.hidden = false;
    await showCheck();
    zone.focus();
  }

  await load();
}
