-- Receipts: every delivery of a queued message gets a number of its own,
-- which alone may settle, hand back or keep the message. The delivery
-- count could not name a delivery: a message handed back with its
-- delivery not counted (the worker answered) and taken again had the same
-- count as before, so a late touch or settle of the first delivery would
-- have acted on the second.
--
-- Released migrations are history: never edit this file (its checksum is
-- pinned in `sqlite/migrate.rs`); change the schema in a new one.

ALTER TABLE queue ADD COLUMN receipt INTEGER NOT NULL DEFAULT 0;
