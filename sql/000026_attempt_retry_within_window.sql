-- A refused attempt's Retry-After never exceeds the 15-minute window. The window may have been
-- opened by a concurrent transaction that started after this one: its end is that transaction's
-- now() + 15 minutes, later than this transaction's now() + 15 minutes, so the seconds left counted
-- from this transaction's now() came to 901 under concurrent sign-ins. They are counted from the
-- clock instead, which is never earlier than the other transaction's start.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.claim_attempt(p_purpose text, p_subject text)
returns table (allowed boolean, retry_after_seconds integer, window_id uuid)
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_allowance integer := crm.attempt_allowance(p_purpose);
  v_window_id uuid;
  v_window_ends_at timestamptz;
begin
  insert into crm.attempt_counters as c (purpose, subject, attempts, window_ends_at)
  values (p_purpose, p_subject, 1, now() + interval '15 minutes')
  on conflict (purpose, subject) do update
    set attempts = case when c.window_ends_at <= now() then 1 else c.attempts + 1 end,
        window_id = case when c.window_ends_at <= now() then crm.uuid_v7() else c.window_id end,
        window_ends_at = case when c.window_ends_at <= now() then now() + interval '15 minutes' else c.window_ends_at end
    where c.window_ends_at <= now() or c.attempts < v_allowance
  returning c.window_id into v_window_id;
  if v_window_id is not null then
    return query select true, 0, v_window_id;
    return;
  end if;
  -- Refused: the row is locked by the statement above and read again with a fresh snapshot.
  select c.window_id, c.window_ends_at into v_window_id, v_window_ends_at
    from crm.attempt_counters c where c.purpose = p_purpose and c.subject = p_subject;
  return query
    select false, least(900, greatest(1, ceil(extract(epoch from v_window_ends_at - clock_timestamp()))))::integer, v_window_id;
end
$$;
