-- Invitations (issue 14): an organisation admin adds someone who is not yet a member by email; the
-- answer is the same whether or not the email belongs to a registered user, and nobody joins an
-- organisation until they accept. Keyed by the lower-cased email, not a user id, so the row exists
-- for unknown emails too (a user created later with that email can accept it).
CREATE TABLE invitations (
    id           uuid PRIMARY KEY,
    org_id       uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    email        text NOT NULL,
    role         text NOT NULL CHECK (role IN ('admin', 'member')),
    invited_by   uuid REFERENCES users(id) ON DELETE SET NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    accepted_at  timestamptz,
    accepted_by  uuid REFERENCES users(id) ON DELETE SET NULL
);
-- One open invitation per organisation and email: inviting again refreshes it.
CREATE UNIQUE INDEX invitations_open ON invitations (org_id, email) WHERE accepted_at IS NULL;
CREATE INDEX invitations_email ON invitations (email) WHERE accepted_at IS NULL;
