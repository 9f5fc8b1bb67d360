-- The worker's webhook statements keep their primary-key probes when the statistics of the delivery
-- tables were taken while those were empty.
--
-- After ANALYZE of an empty table (a fresh install, or vacuumdb after a restore or an upgrade)
-- the planner trusts "no rows" and picks a sequential scan, and a connection keeps a plan made then
-- until the next ANALYZE of the table: the foreign-key check of every attempt against its delivery,
-- and these functions' own probes, then scan every delivery once per delivery. Measured with the
-- first attempts of 5,000 deliveries recorded 100 at a time on one connection: 405 µs a delivery
-- instead of 85 with the scans forbidden (and about 60 when the tables were never analysed).
-- test/webhooks/first-attempts.test.ts counts the scans.
--
-- Setting it on the function covers the statements it runs and the foreign-key checks fired by its
-- writes, which are planned inside it. crm.webhook_first_attempts_to_send has had it since 000012.

alter function crm.record_first_webhook_attempts(uuid, uuid, uuid[], uuid[], timestamptz[], integer[], integer[], text[], text[], integer[])
  set enable_seqscan = off;
alter function crm.record_webhook_attempts(uuid, uuid, uuid[], integer[], timestamptz[], integer[], integer[], text[], text[], integer[])
  set enable_seqscan = off;
alter function crm.webhook_deliveries_to_send(uuid, uuid, uuid[], integer[])
  set enable_seqscan = off;
