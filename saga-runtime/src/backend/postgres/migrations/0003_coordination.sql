-- Filled in by a later change.
SELECT 1;
