-- Time-ordered ids (UUID version 7, RFC 9562) on PostgreSQL 18 and later: the server's own uuidv7(),
-- time-ordered and monotonic within a session. An imported contact takes two ids (the record's and
-- its event's); uuidv7() takes 2.0 µs against 3.7 µs for the SQL of 01_ids.before_18.sql. Every
-- table's id defaults to it, so `crm migrate` applies this file right after migration 000001.
-- needs migration 1

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.uuid_v7()
 returns uuid
 language sql
 parallel safe
return uuidv7();
comment on function crm.uuid_v7() is
  'A time-ordered UUID version 7: PostgreSQL''s uuidv7() (this server is 18 or later).';
grant execute on function crm.uuid_v7() to crm_api;
