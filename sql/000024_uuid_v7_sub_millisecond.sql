-- crm.uuid_v7 on PostgreSQL 15 to 17 takes the sub-millisecond part of the clock into its 12 rand_a
-- bits (RFC 9562, method 3), as uuidv7() does from 18 on. Ids made one after another in a session
-- were ordered only to the millisecond before, then at random: "the newest id" (a webhook
-- subscription's last delivery) could name an older row on those
-- versions. The milliseconds are floored now (they were rounded), so an id never runs ahead of its
-- clock. PostgreSQL 18 and later keep uuidv7().
set local lock_timeout = '5s';
set local statement_timeout = '60s';

do $$
begin
  if current_setting('server_version_num')::integer < 180000 then
    execute $sql$
      create or replace function crm.uuid_v7() returns uuid
      language sql volatile parallel safe
      as $body$
        select encode(
          substring(int8send(floor(c.ms)::bigint) from 3)
          || int2send((28672 + floor((c.ms - floor(c.ms)) * 4096))::smallint)
          || substring(uuid_send(gen_random_uuid()) from 9),
          'hex')::uuid
          from (select extract(epoch from clock_timestamp()) * 1000 as ms) c
      $body$
    $sql$;
    comment on function crm.uuid_v7() is
      'A time-ordered UUID version 7: milliseconds, then 12 bits of the sub-millisecond clock, then random (PostgreSQL 15 to 17; from 18 on, uuidv7()).';
  end if;
end
$$;
