// Adding a device: the hub returns its token once (POST /v1/devices), so the console shows it once,
// inside the one command the device runs, with a copy button; nothing keeps it after the panel closes.
import { api } from './api.js';
import { fill, h, field, notice } from './dom.js';

export const DATA_DIR = '/var/lib/fleethub';

export function agentCommand(token) {
  return `fleethub agent --hub ${location.origin} --token ${token} --data-dir ${DATA_DIR}`;
}

// The command with a placeholder: what an empty list shows before any token exists.
export function commandHint() {
  return h('code', { class: 'command' }, agentCommand('<device token>'));
}

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    // no clipboard (an insecure origin, a refused permission): leave the text selected for Ctrl+C
    const range = document.createRange();
    range.selectNodeContents(button.previousElementSibling);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    button.textContent = 'Selected: press Ctrl+C';
  }
}

// A panel with the form; ``onAdded`` runs after a device was created (the list reloads).
export function addDevicePanel(fleets, onAdded) {
  const name = h('input', { name: 'name', required: true, maxlength: 200, autocomplete: 'off' });
  const fleet = h('select', { name: 'fleet_id' }, h('option', { value: '' }, 'No fleet'),
    fleets.map((f) => h('option', { value: f.id }, f.name)));
  const tags = h('input', { name: 'tags', placeholder: 'eu, kiosk', autocomplete: 'off' });
  const status = h('div', { id: 'add-device-status', 'aria-live': 'polite' });
  const form = h('form', { id: 'add-device-form', class: 'row' }, field('Name', name), field('Fleet', fleet),
    field('Tags', tags, 'comma-separated'), h('button', { type: 'submit' }, 'Add'),
    h('button', { type: 'button', class: 'secondary', onclick: () => close() }, 'Close'));
  const panel = h('section', { class: 'card', id: 'add-device', hidden: true, 'aria-labelledby': 'h-add-device' },
    h('h2', { id: 'h-add-device' }, 'Add a device'), form, status);

  function close() {
    fill(status); // the token leaves the page with the panel
    form.hidden = false;
    panel.hidden = true;
  }

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body = { name: name.value.trim(), tags: splitTags(tags.value) };
    if (fleet.value) body.fleet_id = fleet.value;
    try {
      const created = (await api('POST', '/v1/devices', body)).data;
      name.value = ''; tags.value = '';
      form.hidden = true;
      const command = agentCommand(created.token);
      const copyButton = h('button', { type: 'button', class: 'secondary', id: 'copy-command' }, 'Copy');
      copyButton.addEventListener('click', () => copy(command, copyButton));
      fill(status, h('div', { class: 'notice ok once', role: 'status', id: 'device-token' },
        h('p', {}, h('strong', {}, `${created.name} is added.`),
          ' Run this on the device. Its token is shown now and never again: copy it before closing.'),
        h('div', { class: 'command-row' }, h('code', { class: 'secret command' }, command), copyButton),
        h('p', { class: 'muted' }, 'The token shows in the device\'s process list while this runs; for a device in ',
          'service put it in a file readable by root only and pass --token-file instead (docs/agent.md).'),
        h('div', { class: 'row' }, h('a', { href: `/console/devices/${created.id}` }, 'Open the device'),
          h('button', { type: 'button', id: 'add-device-done', onclick: () => close() }, 'Done'))));
      await onAdded(created);
    } catch (err) { notice(status, err.message, 'error'); }
  });

  return {
    panel,
    open() { panel.hidden = false; form.hidden = false; fill(status); name.focus(); },
  };
}

export function splitTags(text) {
  return text.split(',').map((t) => t.trim()).filter(Boolean);
}
