// Rollouts: the list, and a form that previews the impact before creating one (batched, canary, or
// forced after a confirmation that says it bypasses the update windows).
import { api, query } from '../api.js';
import { fill, h, badge, confirmDialog, field, notice, when } from '../dom.js';
import { localTime } from '../format.js';
import { configLabel, fleetsLabel, waitingText } from './rollout.js';

export async function render(main) {
  const [fleets, configs] = await Promise.all([
    api('GET', '/v1/fleets?limit=500').then((r) => r.data),
    api('GET', '/v1/configurations?limit=100').then((r) => r.data),
  ]);
  const fleetName = new Map(fleets.map((f) => [f.id, f.name]));
  const fleetBoxes = fleets.map((f) => h('label', { class: 'radio' }, h('input', { type: 'checkbox', name: 'fleet', value: f.id }), ` ${f.name}`));
  const config = h('select', { name: 'config', id: 'rollout-config', required: true },
    h('option', { value: '' }, 'Choose…'), configs.map((c) => h('option', { value: c.id }, c.name)));
  const batch = h('input', { type: 'number', name: 'batch', id: 'rollout-batch', min: 1, value: 1 });
  const force = h('input', { type: 'checkbox', name: 'force', id: 'rollout-force' });
  const impact = h('div', { id: 'impact', 'aria-live': 'polite' });
  const status = h('div', { 'aria-live': 'polite' });
  const form = h('form', { id: 'rollout-create', class: 'card' }, h('h2', {}, 'New rollout'),
    h('fieldset', {}, h('legend', {}, 'Fleets'), fleetBoxes.length ? fleetBoxes : h('p', { class: 'muted' }, 'No fleets yet.')),
    h('div', { class: 'row' }, field('Configuration (its current version)', config), field('Batch size', batch, 'the first batch is the canary')),
    h('label', { class: 'radio' }, force, ' Forced: update now, bypassing the fleets\' update windows'),
    h('div', { class: 'row' }, h('button', { type: 'button', class: 'secondary', id: 'rollout-impact', onclick: preview }, 'Preview impact'),
      h('button', { type: 'submit', id: 'rollout-start' }, 'Start rollout')), impact, status);

  const chosen = () => fleetBoxes.map((l) => l.firstChild).filter((b) => b.checked).map((b) => b.value);

  async function currentVersion(configId) {
    const versions = (await api('GET', `/v1/configurations/${configId}/versions?limit=100`)).data;
    return versions.reduce((a, b) => (a && a.version > b.version ? a : b), null);
  }

  async function preview() {
    const fleetIds = chosen();
    if (!fleetIds.length || !config.value) { notice(impact, 'Choose fleets and a configuration.', 'error'); return; }
    try {
      const version = await currentVersion(config.value);
      const rows = [];
      for (const fleetId of fleetIds) {
        const r = (await api('POST', '/v1/rollouts/impact', { fleet_id: fleetId, target_version_id: version.id, force: force.checked })).data;
        rows.push(h('tr', {}, h('td', {}, fleetName.get(fleetId)), h('td', {}, r.eligible_devices), h('td', {}, r.in_window),
          h('td', {}, r.queued_for_next_window, r.queued_for_next_window && r.next_window_at ? ` (until ${localTime(r.next_window_at)})` : ''), h('td', {}, String(r.pending_actions ? Object.values(r.pending_actions).reduce((a, b) => a + (Number(b) || 0), 0) : 0))));
      }
      fill(impact, h('table', { class: 'impact' }, h('thead', {}, h('tr', {},
        ['Fleet', 'Eligible', 'In window', 'Queued for next window', 'Pending actions'].map((t) => h('th', {}, t)))), h('tbody', {}, rows)));
    } catch (err) { notice(impact, err.message, 'error'); }
  }

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const fleetIds = chosen();
    if (!fleetIds.length || !config.value) { notice(status, 'Choose fleets and a configuration.', 'error'); return; }
    if (force.checked && !await confirmDialog('Forced rollout',
      'A forced rollout bypasses the fleets\' update windows: every eligible device updates now, inside its window or not. Health checks still run.',
      'Force the rollout')) return;
    try {
      const r = await api('POST', '/v1/rollouts', { fleet_ids: fleetIds, configuration_id: config.value, batch_size: Number(batch.value) || 1, force: force.checked });
      location.assign(`/console/rollouts/${r.data.id}`);
    } catch (err) { notice(status, err.message, 'error'); }
  });

  const list = h('tbody');
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Rollouts')), form,
    h('section', { class: 'card' }, h('h2', {}, 'Recent rollouts'), h('div', { class: 'scroll' }, h('table', { id: 'rollouts' },
      h('thead', {}, h('tr', {}, ['Rollout', 'State', 'Fleets', 'Configuration', 'Batch size', 'Forced', 'Created'].map((t) => h('th', {}, t)))), list))));
  const r = await api('GET', `/v1/rollouts?${query({ limit: 50 })}`);
  fill(list, ...r.data.map((ro) => {
    const waiting = ro.waiting_for_window || { devices: 0 };
    return h('tr', { dataset: { id: ro.id } },
      h('td', {}, h('a', { href: `/console/rollouts/${ro.id}` }, `${configLabel(ro)} → ${fleetsLabel(ro)}`)),
      h('td', { class: 'state' }, badge(ro.state), waiting.devices && ['running', 'pending'].includes(ro.state)
        ? h('small', { class: 'waiting' }, ` ${waiting.devices} device${waiting.devices === 1 ? '' : 's'} ${waitingText(waiting.until)}`) : null),
      h('td', {}, fleetsLabel(ro)), h('td', {}, configLabel(ro)),
      h('td', {}, ro.batch_size ?? '–'), h('td', {}, ro.force ? 'yes' : 'no'), h('td', {}, when(ro.created_at)));
  }));
  if (!r.data.length) list.append(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No rollouts yet.')));
}
