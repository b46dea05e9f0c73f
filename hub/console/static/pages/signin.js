import { api, session } from '../api.js';
import { fill, h, field, notice } from '../dom.js';

export function render(main) {
  const email = h('input', { type: 'email', name: 'email', id: 'email', autocomplete: 'username', required: true });
  const password = h('input', { type: 'password', name: 'password', id: 'password', autocomplete: 'current-password', required: true });
  const status = h('div', { role: 'alert' });
  const form = h('form', { class: 'card narrow', id: 'signin' },
    h('h1', {}, 'Sign in'), field('Email', email), field('Password', password), status,
    h('button', { type: 'submit' }, 'Sign in'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    notice(status, '');
    try {
      const r = await api('POST', '/v1/auth/login', { email: email.value, password: password.value },
        { org: false, redirect: false });
      session.setEmail(r.data.email);
      const next = new URLSearchParams(location.search).get('next');
      // only a path of this console: never an address elsewhere
      location.assign(next && next.startsWith('/console/') ? next : '/console/devices');
    } catch (err) {
      notice(status, err.message, 'error');
    }
  });
  fill(main, form);
  email.focus();
}
