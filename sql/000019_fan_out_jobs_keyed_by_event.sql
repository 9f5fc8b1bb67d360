-- The outbox's hand-off to the webhooks worker as one insert into the job queue. graphile-worker's
-- add_job without a job key goes through add_jobs: two upserts of the task and queue names, then
-- an UPDATE that clears the keys of locked jobs having the keys being added (joined to the queue
-- on the key, even when none is given), a notification, and the insert. Measured on one
-- connection: 1.0-1.3 ms of PostgreSQL per add_job, with 0 or 10,000 jobs pending; under the
-- records benchmark, where the queue grew without a worker, the UPDATE was seen planned as a scan
-- of the queue and add_job grew with it (1.2 ms at 4,000 pending jobs, 1.9 ms at 6,000).
--
-- Each fan-out job now carries a key of its own, the first id of the events it carries
-- ('fan_out_event:<event id>'), and is added in job_key_mode 'unsafe_dedupe': the task's upsert and
-- one INSERT whose conflict target is the key's unique index; no UPDATE, so no plan of it can scan
-- the queue. About 0.3-0.45 ms per add_job, with 0 or 10,000 jobs pending. Event ids are fresh
-- uuid_v7 values of one statement's events, so no two fan-out jobs share a key and the mode's
-- deduplication (keep the job already queued under that key) never applies: every statement that
-- wrote events still adds exactly one job for them.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.enqueue_event_fan_out(event_ids uuid[]) returns void
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if event_ids is null or cardinality(event_ids) = 0 then
    return;
  end if;
  perform graphile_worker.add_job('fan_out_event', json_build_object('event_ids', event_ids), max_attempts => 25,
                                  job_key => 'fan_out_event:' || event_ids[1]::text, job_key_mode => 'unsafe_dedupe');
end
$$;
comment on function crm.enqueue_event_fan_out(uuid[]) is
  'Called by the outbox triggers with the ids of the events one statement wrote: adds one fan_out_event job for them, keyed by the first event id (a plain insert into the queue, no scan of it).';
