// Access: who I am, invitations for me, my personal API tokens (the secret shown once), members and
// inviting one, relation tuples and service accounts (the client secret shown once). Admin-only parts
// say so when refused. Relations name their objects and subjects (a fleet's name, a member's email), with
// the ids in the titles.
import { api, nameOf, session } from '../api.js';
import { fill, h, badge, field, notice, when } from '../dom.js';

const RELATIONS = ['viewer', 'editor', 'billing_viewer', 'billing_admin', 'tunnel_access', 'audit_viewer'];

function shownOnce(label, secret) {
  return h('div', { class: 'notice ok once', role: 'status' }, h('strong', {}, `${label} (shown once; copy it now): `),
    h('code', { class: 'secret' }, secret));
}

// Invitations addressed to the signed-in person, each with Accept: also what a person who belongs to
// no organisation yet sees (app.js), since accepting is how they join one.
export async function myInvitations(el, onAccepted) {
  let list = [];
  try { list = (await api('GET', '/v1/me/invitations', undefined, { org: false })).data; } catch (err) {
    fill(el, h('p', { class: 'muted' }, err.message)); return;
  }
  fill(el, list.length ? h('ul', { class: 'plain', id: 'my-invitations' }, list.map((i) => {
    const accept = h('button', { type: 'button' }, 'Accept');
    accept.addEventListener('click', async () => {
      try {
        const r = (await api('POST', `/v1/invitations/${i.id}/accept`, undefined, { org: false })).data;
        session.setOrg(r.organization_id);
        await onAccepted(r);
      } catch (err) { notice(el, err.message, 'error'); }
    });
    return h('li', { class: 'row' }, `${i.organization.name} invites you as ${i.role} (until `, when(i.expires_at), ') ', accept);
  })) : h('p', { class: 'muted' }, 'No invitations for you.'));
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

  // -- inviting a member: an email that is not a member gets an invitation (202); a member's email
  // changes that member's role (200)
  const inviteMsg = h('div', { id: 'invite-result', 'aria-live': 'polite' });
  const inviteEmail = h('input', { type: 'email', name: 'email', required: true, maxlength: 320, autocomplete: 'off' });
  const inviteRole = h('select', { name: 'role' }, h('option', { value: 'member' }, 'member'), h('option', { value: 'admin' }, 'admin'));
  const inviteForm = h('form', { id: 'invite', class: 'row' }, field('Email', inviteEmail), field('Role', inviteRole),
    h('button', { type: 'submit' }, 'Invite'));
  inviteForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const r = await api('POST', '/v1/members', { email: inviteEmail.value.trim(), role: inviteRole.value });
      const d = r.data;
      inviteEmail.value = '';
      fill(inviteMsg, d.status === 'pending'
        ? h('div', { class: 'notice ok', role: 'status' }, h('strong', {}, `${d.email} is invited as ${d.role}.`),
          ' Next, they sign in to this console at ', h('code', {}, `${location.origin}/console/`),
          ' and accept the invitation (on their Access page, or the page they see first). Until ', when(d.expires_at),
          '. Someone without an account here gets one from the hub\'s operator first: ',
          h('code', {}, `fleethub admin create-user ${d.email} --org ${session.org} --password …`),
          ' (that also makes them a member at once).')
        : h('div', { class: 'notice ok', role: 'status' }, `${d.email} is a member already; their role is now ${d.role}.`));
      await loadAdmin();
    } catch (err) { notice(inviteMsg, err.status === 403 ? 'Only an organisation admin can invite.' : err.message, 'error'); }
  });
  const invitations = h('div', { id: 'invitations' });
  const mine = h('div', { id: 'invitations-for-me' });

  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Access')),
    h('section', { class: 'card' }, h('h2', {}, 'Who I am'), h('dl', { class: 'facts' },
      h('dt', {}, 'Email'), h('dd', {}, session.email || '–'), h('dt', {}, 'User id'), h('dd', {}, me.userId),
      h('dt', {}, 'Signed in with'), h('dd', {}, me.credential), h('dt', {}, 'Role here'), h('dd', {}, role || '–'))),
    h('section', { class: 'card' }, h('h2', {}, 'Personal API tokens'), h('div', { class: 'scroll' }, h('table', { id: 'pats' }, h('thead', {}, h('tr', {},
      ['Token id', 'Description', 'Created', 'Last used', 'Expires', ''].map((t) => h('th', {}, t)))), pats)), patForm, patMsg),
    h('section', { class: 'card' }, h('h2', {}, 'Invitations for me'), mine),
    h('section', { class: 'card' }, h('h2', {}, 'Members'), members, h('h3', {}, 'Invite a member'), inviteForm, inviteMsg,
      h('h3', {}, 'Open invitations'), invitations),
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
    const [memberList, , accountList] = await Promise.all([
      table(members, '/v1/members', ['Email', 'Name', 'Role', 'Since'], (m) => [m.email, m.name, badge(m.role), when(m.created_at)]),
      table(invitations, '/v1/invitations', ['Email', 'Role', 'Sent', 'Expires', ''], (i) => [i.email, badge(i.role), when(i.created_at),
        when(i.expires_at), h('button', { type: 'button', class: 'danger', onclick: async () => {
          try { await api('DELETE', `/v1/invitations/${i.id}`); await loadAdmin(); } catch (err) { notice(inviteMsg, err.message, 'error'); }
        } }, 'Revoke')]),
      table(accounts, '/v1/service-accounts', ['Name', 'Client id', 'Description', 'Created'], (a) => [a.name, h('code', {}, a.client_id), a.description, when(a.created_at)]),
    ]);
    const who = new Map([...memberList.map((m) => [`user ${m.id}`, m.email]), ...accountList.map((a) => [`service ${a.id}`, `service account ${a.name}`])]);
    const subject = (r) => h('span', { class: 'subject-name', title: r.subject_id }, who.get(`${r.subject_type} ${r.subject_id}`) || `${r.subject_type} ${r.subject_id}`);
    await table(relations, '/v1/relations', ['Object', 'Relation', 'Subject'], (r) => [objectName(r), r.relation, subject(r)]);
  }

  await Promise.all([loadPats(), loadAdmin(), myInvitations(mine, () => location.reload())]);
}
