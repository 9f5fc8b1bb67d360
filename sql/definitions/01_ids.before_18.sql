-- Time-ordered ids (UUID version 7, RFC 9562) on PostgreSQL 15 to 17, which have no uuidv7(): the
-- milliseconds, then the sub-millisecond part of the clock in the 12 rand_a bits (RFC 9562, method
-- 3, as uuidv7() does), then random bits, so ids made one after another in a session are ordered.
-- The milliseconds are floored, so an id never runs ahead of its clock. Every table's id defaults to
-- it, so `crm migrate` applies this file right after migration 000001.
-- needs migration 1

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.uuid_v7()
 returns uuid
 language sql
 parallel safe
as $function$
  select encode(
    substring(int8send(floor(c.ms)::bigint) from 3)
    || int2send((28672 + floor((c.ms - floor(c.ms)) * 4096))::smallint)
    || substring(uuid_send(gen_random_uuid()) from 9),
    'hex')::uuid
    from (select extract(epoch from clock_timestamp()) * 1000 as ms) c
$function$;
comment on function crm.uuid_v7() is
  'A time-ordered UUID version 7: milliseconds, then 12 bits of the sub-millisecond clock, then random (PostgreSQL 15 '
  'to 17; from 18 on, uuidv7()).';
grant execute on function crm.uuid_v7() to crm_api;
