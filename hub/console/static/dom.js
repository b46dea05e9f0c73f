// Building the page without innerHTML: every string becomes a Text node or an attribute value, so
// a device named <img src=x onerror=alert(1)> is shown as those characters and never parsed as HTML.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value' || key === 'checked' || key === 'disabled' || key === 'selected') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  add(el, children);
  return el;
}

export function add(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function setText(el, value) {
  el.textContent = value === null || value === undefined ? '' : String(value);
}

export function when(value) {
  // an RFC 3339 instant in the viewer's local time, with the instant itself in the title
  if (!value) return h('span', { class: 'muted' }, 'never');
  const d = new Date(value);
  return h('time', { datetime: value, title: value }, Number.isNaN(d.getTime()) ? value : d.toLocaleString());
}

export function badge(text, kind) {
  return h('span', { class: `badge ${kind || ''}` }, text);
}

export function field(label, control, hint) {
  return h('label', { class: 'field' }, h('span', {}, label), control, hint ? h('small', { class: 'muted' }, hint) : null);
}

// bytes() lives with the other formats; re-exported for the pages that take it from here
export { bytes } from './format.js';

// A modal confirmation built on <dialog> (keyboard: Tab between buttons, Escape cancels).
export function confirmDialog(title, message, okLabel) {
  return new Promise((resolve) => {
    const dialog = h('dialog', { class: 'confirm', 'aria-labelledby': 'confirm-title' },
      h('h2', { id: 'confirm-title' }, title), h('p', {}, message),
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'secondary', value: 'cancel', onclick: () => dialog.close('cancel') }, 'Cancel'),
        h('button', { type: 'button', class: 'danger', value: 'ok', onclick: () => dialog.close('ok') }, okLabel || 'Confirm')));
    dialog.addEventListener('close', () => { dialog.remove(); resolve(dialog.returnValue === 'ok'); });
    document.body.append(dialog);
    dialog.showModal();
  });
}

export function notice(el, message, kind) {
  el.replaceChildren();
  if (message) el.append(h('p', { class: `notice ${kind || ''}` }, message));
}

// replaceChildren that takes what h() takes: arrays flattened, null/false left out, strings as text
export function fill(el, ...children) {
  el.replaceChildren();
  return add(el, children);
}
