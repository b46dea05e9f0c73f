// Access: who I am, my personal API tokens (the secret shown once), members, relation tuples and
// service accounts (the client secret shown once). Admin-only parts say so when refused. Relations
// name their objects and subjects (a fleet's name, a member's email), with the ids in the titles.
import { api, nameOf, session } from '../api.js';
import { fill, h, badge, field, notice, when } from '../dom.js';

const RELATIONS = ['viewer', 'editor', 'billing_viewer', 'billing_admin', 'tunnel_access', 'audit_viewer'];

function shownOnce(label, secret) {
  return h('div', { class: 'notice ok once', role: 'status' }, h('strong', {}, `${label} (shown once; copy it now): `),
    h('code', { class: 'secret' }, secret));
}

export async function render(main) {
  const me = session.me;
  const role = (me.organizations || []).find((o) => o.id === session.org)?.role;
  const pats = h('tbody');
  const patMsg = h('div', { id: 'pat-created', 'aria-live': 'polite' });
  const patDesc = h('input', { name: 'description', maxlength: 200 });
  const patForm = h('form', { id: 'pat-create', class: 'row' }, field('Description', patDesc), h('button', { type: 'submit' }, 'Create token'));
  patForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const r = (await api('POST', '/v1/pats', { description: patDesc.value }, { org: false })).data;
      patDesc.value = '';
      fill(patMsg, shownOnce(`Token ${r.id}: secret`, r.secret));
      await loadPats();
    } catch (err) { notice(patMsg, err.message, 'error'); }
  });
  const members = h('div', { id: 'members' });
  const relations = h('div', { id: 'relations' });
  const accounts = h('div', { id: 'service-accounts' });
  const saMsg = h('div', { 'aria-live': 'polite' });
  const saName = h('input', { name: 'name', required: true, maxlength: 200 });
  const saRelation = h('select', { name: 'relation' }, RELATIONS.map((r) => h('option', { value: r }, r)));
  const saForm = h('form', { id: 'sa-create', class: 'row' }, field('Name', saName), field('Organisation-wide relation', saRelation),
    h('button', { type: 'submit' }, 'Create service account'));
  saForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const r = (await api('POST', '/v1/service-accounts', { name: saName.value, policies: [{ relation: saRelation.value, object_type: 'organization' }] })).data;
      saName.value = '';
      fill(saMsg, shownOnce(`Client ${r.client_id}: client secret`, r.client_secret));
      await loadAdmin();
    } catch (err) { notice(saMsg, err.message, 'error'); }
  });

  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Access')),
    h('section', { class: 'card' }, h('h2', {}, 'Who I am'), h('dl', { class: 'facts' },
      h('dt', {}, 'Email'), h('dd', {}, session.email || '–'), h('dt', {}, 'User id'), h('dd', {}, me.userId),
      h('dt', {}, 'Signed in with'), h('dd', {}, me.credential), h('dt', {}, 'Role here'), h('dd', {}, role || '–'))),
    h('section', { class: 'card' }, h('h2', {}, 'Personal API tokens'), h('div', { class: 'scroll' }, h('table', { id: 'pats' }, h('thead', {}, h('tr', {},
      ['Token id', 'Description', 'Created', 'Last used', 'Expires', ''].map((t) => h('th', {}, t)))), pats)), patForm, patMsg),
    h('section', { class: 'card' }, h('h2', {}, 'Members'), members),
    h('section', { class: 'card' }, h('h2', {}, 'Relations'), relations),
    h('section', { class: 'card' }, h('h2', {}, 'Service accounts'), accounts, saForm, saMsg));

  async function loadPats() {
    const list = (await api('GET', '/v1/pats', undefined, { org: false })).data;
    fill(pats, list.map((p) => h('tr', {}, h('td', {}, h('code', {}, p.id)), h('td', {}, p.description), h('td', {}, when(p.created_at)),
      h('td', {}, when(p.last_used_at)), h('td', {}, p.expires_at ? when(p.expires_at) : 'never'),
      h('td', {}, h('button', { type: 'button', class: 'danger', onclick: async () => { await api('DELETE', `/v1/pats/${p.id}`, undefined, { org: false }); await loadPats(); } }, 'Revoke')))));
  }

  // The list it showed ([] when refused or failed), for the relations' names.
  async function table(el, path, columns, row) {
    try {
      const list = (await api('GET', path)).data;
      fill(el, list.length ? h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, columns.map((c) => h('th', {}, c)))), h('tbody', {}, list.map((x) => h('tr', {}, row(x).map((v) => h('td', {}, v)))))))
        : h('p', { class: 'muted' }, 'None.'));
      return list;
    } catch (err) {
      fill(el, h('p', { class: 'muted' }, err.status === 403 ? 'Only an organisation admin sees this.' : err.message));
      return [];
    }
  }

  // The object's name once nameOf has it (the id until then, and for good when it cannot be read).
  function objectName(r) {
    if (r.object_type === 'organization') return 'organization (this one)';
    const shown = h('span', { class: 'object-name', title: r.object_id }, r.object_id);
    nameOf(r.object_type, r.object_id).then((name) => { shown.textContent = name; });
    return [`${r.object_type} `, shown];
  }

  async function loadAdmin() {
    const [memberList, accountList] = await Promise.all([
      table(members, '/v1/members', ['Email', 'Name', 'Role', 'Since'], (m) => [m.email, m.name, badge(m.role), when(m.created_at)]),
      table(accounts, '/v1/service-accounts', ['Name', 'Client id', 'Description', 'Created'], (a) => [a.name, h('code', {}, a.client_id), a.description, when(a.created_at)]),
    ]);
    const who = new Map([...memberList.map((m) => [`user ${m.id}`, m.email]), ...accountList.map((a) => [`service ${a.id}`, `service account ${a.name}`])]);
    const subject = (r) => h('span', { class: 'subject-name', title: r.subject_id }, who.get(`${r.subject_type} ${r.subject_id}`) || `${r.subject_type} ${r.subject_id}`);
    await table(relations, '/v1/relations', ['Object', 'Relation', 'Subject'], (r) => [objectName(r), r.relation, subject(r)]);
  }

  await Promise.all([loadPats(), loadAdmin()]);
}
