ALTER TABLE tickets
    ADD COLUMN closed_by TEXT,
    ADD COLUMN reminded  BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX tickets_open ON tickets (opened_at) WHERE status = 'open';
