CREATE TABLE tickets (
    id         BIGSERIAL PRIMARY KEY,
    title      TEXT NOT NULL,
    body       TEXT NOT NULL DEFAULT '',
    email      TEXT NOT NULL,
    assignee   TEXT NOT NULL,
    status     TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    opened_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
