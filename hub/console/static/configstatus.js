// A device's configuration status as every page shows it: the status with the version's number, in
// the colour of what it means for the device (a rejected or failed version is not healthy), and the
// device's own words about a rejection, shown as text (never parsed: dom.js).
import { h, badge } from './dom.js';

const TONES = { applied: 'ok', pending: 'warn', applying: 'warn', rejected: 'bad', failed: 'bad' };

export function configBadge(c) {
  if (!c || !c.status) return h('span', { class: 'muted' }, 'none');
  const version = c.status === 'applied' ? c.applied_version : c.version;
  const label = version === null || version === undefined ? c.status : `${c.status} v${version}`;
  const el = badge(label, TONES[c.status] || '');
  el.classList.add('config-status');
  if (c.error) el.title = c.error;
  return el;
}

// The health check's output and the workload log's end that came with a rejection; null without them.
export function rejectionOutput(c) {
  if (!c || (!c.check_output && !c.workload_log)) return null;
  return h('div', { class: 'rejection' },
    c.check_output ? [h('h3', {}, 'Health check output'), h('pre', { class: 'output check-output' }, c.check_output)] : null,
    c.workload_log ? h('details', {}, h('summary', {}, 'Workload log (last lines)'),
      h('pre', { class: 'output workload-log' }, c.workload_log)) : null,
    h('p', { class: 'muted' }, 'The last lines as the device sent them (at most 20 lines, 2 KiB each).'));
}
