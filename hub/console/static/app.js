// Every console page: who is signed in, the organisation switcher and the navigation, then the page.
import { api, ApiError, session, signInUrl } from './api.js';
import { fill, h } from './dom.js';

const PAGES = {
  signin: './pages/signin.js',
  devices: './pages/devices.js',
  device: './pages/device.js',
  rollouts: './pages/rollouts.js',
  rollout: './pages/rollout.js',
  fleets: './pages/fleets.js',
  configurations: './pages/configurations.js',
  audit: './pages/audit.js',
  access: './pages/access.js',
  billing: './pages/billing.js',
  assistant: './pages/assistant.js',
  webhooks: './pages/webhooks.js',
};

function header(me) {
  const top = document.getElementById('top');
  const orgs = me.organizations || [];
  const select = h('select', { id: 'org-switch', 'aria-label': 'Organisation' },
    orgs.map((o) => h('option', { value: o.id, selected: o.id === session.org }, `${o.name} (${o.role})`)));
  select.addEventListener('change', () => { session.setOrg(select.value); location.assign('/console/devices'); });
  const current = document.body.dataset.page;
  const link = (href, label, pages) => h('a', { href, 'aria-current': pages.includes(current) ? 'page' : null }, label);
  const signOut = h('button', { type: 'button', class: 'secondary', id: 'sign-out' }, 'Sign out');
  signOut.addEventListener('click', async () => {
    session.leaving = true; // this navigation, not a refused request's, ends the page (api.js)
    try { await api('POST', '/v1/auth/logout', undefined, { org: false }); } catch { /* signed out anyway */ }
    location.assign('/console/signin');
  });
  fill(top, 
    h('a', { class: 'brand', href: '/console/devices' }, 'fleethub'),
    h('nav', { 'aria-label': 'Console' }, link('/console/devices', 'Devices', ['devices', 'device']),
      link('/console/rollouts', 'Rollouts', ['rollouts', 'rollout']), link('/console/fleets', 'Fleets', ['fleets']),
      link('/console/configurations', 'Configurations', ['configurations']), link('/console/audit', 'Audit', ['audit']),
      link('/console/access', 'Access', ['access']), link('/console/billing', 'Billing', ['billing']),
      link('/console/assistant', 'Assistant', ['assistant']), link('/console/webhooks', 'Webhooks', ['webhooks'])),
    h('div', { class: 'who' }, select,
      h('span', { id: 'whoami', title: me.userId || '' }, session.email || me.userId || ''), signOut));
}

async function boot() {
  const page = document.body.dataset.page;
  const main = document.getElementById('main');
  const module = await import(PAGES[page]);
  if (page === 'signin') { module.render(main); return; }
  try {
    const current = await api('GET', '/v1/auth/session', undefined, { org: false, redirect: false });
    session.csrf = current.data.csrfToken;
  } catch (err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 400)) { location.replace(signInUrl()); return; }
    throw err;
  }
  const me = (await api('GET', '/v1/me', undefined, { org: false })).data;
  session.me = me;
  if (!(me.organizations || []).some((o) => o.id === session.org)) session.setOrg(me.organizations?.[0]?.id || null);
  header(me);
  if (!session.org) {
    // joining is accepting an invitation: show them here, where a new member lands
    const list = h('div');
    fill(main, h('section', { class: 'card' }, h('h1', {}, 'Invitations'),
      h('p', {}, 'You are not a member of any organisation yet. Accept an invitation to join one.'), list));
    const { myInvitations } = await import('./pages/access.js');
    await myInvitations(list, () => location.assign('/console/devices'));
    return;
  }
  await module.render(main, document.body.dataset.id);
}

boot().catch((err) => {
  const main = document.getElementById('main');
  fill(main, h('p', { class: 'notice error', role: 'alert' }, `The page could not load: ${err.message}`));
});
