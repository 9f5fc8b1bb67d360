-- The access audit log: the entry writer and its hash chain, the triggers that write an entry for
-- every change to who may do what (docs/api.md section 11), the append-only guard, retention and
-- verification.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.audit_canonical(e crm.audit_log)
 returns text
 language sql
 stable
as $function$
  select e.id::text || E'\n' || e.workspace_id::text || E'\n' || e.seq::text || E'\n'
         || to_char(e.occurred_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || E'\n'
         || e.action || E'\n'
         || coalesce(e.actor_user_id::text, '') || E'\n' || e.actor_via || E'\n'
         || coalesce(e.actor_token_id::text, '') || E'\n' || coalesce(e.actor_app_id::text, '') || E'\n'
         || coalesce(host(e.actor_ip), '') || E'\n'
         || e.target_type || E'\n' || coalesce(e.target_id::text, '') || E'\n'
         || e.details::text
$function$;
comment on function crm.audit_canonical(e crm.audit_log) is
  'An audit entry''s canonical content, what its hash covers: id, workspace_id, seq, occurred_at (RFC 3339, UTC, '
  'milliseconds), action, actor user, via, token, app, ip, target type, target id (absent ones empty) and details as '
  'PostgreSQL prints jsonb, joined by line feeds (docs/api.md section 11).';
grant execute on function crm.audit_canonical(e crm.audit_log) to crm_api;

create or replace function crm.audit_hash(e crm.audit_log)
 returns bytea
 language sql
 stable
as $function$
  select sha256(e.prev_hash || convert_to(crm.audit_canonical(e), 'UTF8'))
$function$;
comment on function crm.audit_hash(e crm.audit_log) is
  'SHA-256 over the previous entry''s hash (32 bytes) followed by the entry''s canonical content in UTF-8.';
grant execute on function crm.audit_hash(e crm.audit_log) to crm_api;

create or replace function crm.audit_write(
  p_workspace_id uuid,
  p_action text,
  p_target_type text,
  p_target_id uuid,
  p_details jsonb
)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_entry crm.audit_log;
  v_genesis constant bytea := decode(repeat('00', 32), 'hex');
begin
  -- A workspace being deleted takes its log with it; its members' and roles' cascades write nothing.
  if p_workspace_id is null or not exists (select 1 from crm.workspaces w where w.id = p_workspace_id) then
    return;
  end if;
  -- The workspace's head row is the chain's lock: held to the end of this transaction, it orders the
  -- workspace's writers one after the other and never touches another workspace's writers.
  update crm.audit_chain_heads h set last_seq = h.last_seq + 1
   where h.workspace_id = p_workspace_id
  returning h.last_seq, h.last_hash into v_entry.seq, v_entry.prev_hash;
  if not found then
    insert into crm.audit_chain_heads as h (workspace_id, last_seq, last_hash, anchor_hash)
    values (p_workspace_id, 1, v_genesis, v_genesis)
    on conflict (workspace_id) do update set last_seq = h.last_seq + 1
    returning h.last_seq, h.last_hash into v_entry.seq, v_entry.prev_hash;
  end if;
  v_entry.workspace_id := p_workspace_id;
  v_entry.id := crm.uuid_v7();
  v_entry.occurred_at := date_trunc('milliseconds', now());
  v_entry.action := p_action;
  v_entry.actor_user_id := crm.current_user_id();
  v_entry.actor_via := crm.event_actor() ->> 'via';
  v_entry.actor_token_id := crm.current_token_id();
  v_entry.actor_app_id := crm.current_oauth_app_id();
  v_entry.actor_ip := nullif(current_setting('crm.client_address', true), '')::inet;
  v_entry.target_type := p_target_type;
  v_entry.target_id := p_target_id;
  v_entry.details := coalesce(jsonb_strip_nulls(p_details), '{}');
  v_entry.hash := crm.audit_hash(v_entry);
  insert into crm.audit_log select v_entry.*;
  update crm.audit_chain_heads h set last_hash = v_entry.hash, last_id = v_entry.id where h.workspace_id = p_workspace_id;
end
$function$;
comment on function crm.audit_write(p_workspace_id uuid, p_action text, p_target_type text, p_target_id uuid, p_details jsonb) is
  'Appends an entry to a workspace''s audit log, chained to the one before, with the actor of the request context '
  '(and the client address the service put in crm.client_address). Only the owner''s triggers call it.';

create or replace function crm.audit_write_for_user(p_user_id uuid, p_action text, p_details jsonb)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_workspace_id uuid;
begin
  -- A user's own access (sign-in, suspension, API access, two-factor, personal tokens) holds in every
  -- workspace of theirs: each workspace's admins see it. In workspace order, so two such writers
  -- take the heads in the same order and never deadlock.
  for v_workspace_id in select m.workspace_id from crm.memberships m where m.user_id = p_user_id order by m.workspace_id loop
    perform crm.audit_write(v_workspace_id, p_action, 'user', p_user_id, p_details);
  end loop;
end
$function$;
comment on function crm.audit_write_for_user(p_user_id uuid, p_action text, p_details jsonb) is
  'Appends an entry about a user''s own access to the audit log of every workspace the user is a member of.';

create or replace function crm.tg_memberships__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'member.added', 'user', new.user_id, jsonb_build_object('role_id', new.role_id));
  elsif tg_op = 'DELETE' then
    perform crm.audit_write(old.workspace_id, 'member.removed', 'user', old.user_id, jsonb_build_object('role_id', old.role_id));
  else
    if old.role_id is distinct from new.role_id then
      perform crm.audit_write(new.workspace_id, 'member.role_changed', 'user', new.user_id,
                              jsonb_build_object('role_id', new.role_id, 'previous_role_id', old.role_id));
    end if;
    if (old.suspended_at is null) <> (new.suspended_at is null) then
      perform crm.audit_write(new.workspace_id, case when new.suspended_at is null then 'member.unsuspended' else 'member.suspended' end,
                              'user', new.user_id, '{}');
    end if;
  end if;
  return null;
end
$function$;
comment on function crm.tg_memberships__audit() is
  'Audit: member.added, member.removed, member.role_changed, member.suspended, member.unsuspended.';

create or replace function crm.tg_roles__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'role.created', 'role', new.id, jsonb_build_object('name', new.name, 'is_admin', new.is_admin));
  elsif tg_op = 'DELETE' then
    perform crm.audit_write(old.workspace_id, 'role.deleted', 'role', old.id, jsonb_build_object('name', old.name));
  elsif old.name is distinct from new.name or old.is_admin is distinct from new.is_admin then
    perform crm.audit_write(new.workspace_id, 'role.changed', 'role', new.id,
                            jsonb_build_object('name', new.name, 'is_admin', new.is_admin,
                                               'previous', jsonb_build_object('name', old.name, 'is_admin', old.is_admin)));
  end if;
  return null;
end
$function$;
comment on function crm.tg_roles__audit() is 'Audit: role.created, role.changed (name, is_admin), role.deleted.';

create or replace function crm.tg_role_grants__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_before jsonb := '[]';
  v_after jsonb := '[]';
  v_change record;
begin
  -- One entry per role and statement, however many grants it wrote: what was added and removed as
  -- resource:action:scope (a changed scope is one removed and one added). A transition table exists
  -- only for its own events, so each is read under its own branch.
  if tg_op in ('UPDATE', 'DELETE') then
    select coalesce(jsonb_agg(jsonb_build_object('w', o.workspace_id, 'r', o.role_id, 'g', o.resource || ':' || o.action || ':' || o.scope)), '[]')
      into v_before from old_table o;
  end if;
  if tg_op in ('UPDATE', 'INSERT') then
    select coalesce(jsonb_agg(jsonb_build_object('w', n.workspace_id, 'r', n.role_id, 'g', n.resource || ':' || n.action || ':' || n.scope)), '[]')
      into v_after from new_table n;
  end if;
  for v_change in
    with before as (
      select * from jsonb_to_recordset(v_before) as b(w uuid, r uuid, g text)
    ), after as (
      select * from jsonb_to_recordset(v_after) as a(w uuid, r uuid, g text)
    ), changes as (
      select a.w, a.r, a.g, 'added' as how from after a
       where not exists (select 1 from before b where b.w = a.w and b.r = a.r and b.g = a.g)
      union all
      select b.w, b.r, b.g, 'removed' from before b
       where not exists (select 1 from after a where a.w = b.w and a.r = b.r and a.g = b.g)
    )
    select c.w as workspace_id, c.r as role_id,
           coalesce(jsonb_agg(c.g order by c.g) filter (where c.how = 'added'), '[]') as added,
           coalesce(jsonb_agg(c.g order by c.g) filter (where c.how = 'removed'), '[]') as removed
      from changes c
     where exists (select 1 from crm.roles r where r.workspace_id = c.w and r.id = c.r)
     group by c.w, c.r
     order by c.w, c.r
  loop
    perform crm.audit_write(v_change.workspace_id, 'role.grants_changed', 'role', v_change.role_id,
                            jsonb_build_object('added', v_change.added, 'removed', v_change.removed));
  end loop;
  return null;
end
$function$;
comment on function crm.tg_role_grants__audit() is
  'Audit: role.grants_changed, one entry per role and statement with the grants added and removed '
  '(none when the role itself is deleted: role.deleted says it).';

create or replace function crm.tg_teams__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'team.created', 'team', new.id, jsonb_build_object('name', new.name));
  elsif tg_op = 'DELETE' then
    perform crm.audit_write(old.workspace_id, 'team.deleted', 'team', old.id, jsonb_build_object('name', old.name));
  elsif old.name is distinct from new.name then
    perform crm.audit_write(new.workspace_id, 'team.renamed', 'team', new.id, jsonb_build_object('name', new.name, 'previous_name', old.name));
  end if;
  return null;
end
$function$;
comment on function crm.tg_teams__audit() is 'Audit: team.created, team.renamed, team.deleted.';

create or replace function crm.tg_team_members__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'team.member_added', 'user', new.user_id, jsonb_build_object('team_id', new.team_id));
  elsif exists (select 1 from crm.teams t where t.workspace_id = old.workspace_id and t.id = old.team_id) then
    perform crm.audit_write(old.workspace_id, 'team.member_removed', 'user', old.user_id, jsonb_build_object('team_id', old.team_id));
  end if;
  return null;
end
$function$;
comment on function crm.tg_team_members__audit() is
  'Audit: team.member_added, team.member_removed (none when the team itself is deleted: team.deleted says it).';

create or replace function crm.tg_invitations__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'invitation.sent', 'invitation', new.id,
                            jsonb_build_object('email', new.email, 'role_id', new.role_id, 'expires_at', crm.api_time(new.expires_at)));
  elsif tg_op = 'UPDATE' then
    if old.accepted_at is null and new.accepted_at is not null then
      perform crm.audit_write(new.workspace_id, 'invitation.accepted', 'invitation', new.id,
                              jsonb_build_object('email', new.email, 'role_id', new.role_id, 'user_id', new.accepted_by));
    end if;
  elsif old.accepted_at is null and old.expires_at > now() then
    -- Housekeeping's removal of long-expired or accepted invitations revokes nothing.
    perform crm.audit_write(old.workspace_id, 'invitation.revoked', 'invitation', old.id, jsonb_build_object('email', old.email));
  end if;
  return null;
end
$function$;
comment on function crm.tg_invitations__audit() is
  'Audit: invitation.sent, invitation.accepted, invitation.revoked (a pending invitation deleted). Never the '
  'invitation''s token or its hash.';

create or replace function crm.tg_tokens__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- An OAuth app's access tokens come and go with its grant, whose entries say so (oauth_grant.*).
  if tg_op = 'INSERT' then
    if crm.current_user_id() is null then
      -- Issued without a request context: a sign-in (password, two-factor) or a sign-up.
      perform crm.audit_write_for_user(new.user_id, 'user.signed_in', jsonb_build_object('kind', new.kind, 'token_id', new.id));
    else
      perform crm.audit_write_for_user(new.user_id, 'token.created',
                                       jsonb_build_object('token_id', new.id, 'kind', new.kind, 'name', new.name,
                                                          'scopes', to_jsonb(new.scopes), 'expires_at', crm.api_time(new.expires_at)));
    end if;
  else
    perform crm.audit_write_for_user(new.user_id, 'token.revoked', jsonb_build_object('token_id', new.id, 'kind', new.kind, 'name', new.name));
  end if;
  return null;
end
$function$;
comment on function crm.tg_tokens__audit() is
  'Audit: user.signed_in (a token or session issued without a request context), token.created (kind, name, '
  'scopes, expiry), token.revoked; never the token or its hash.';

create or replace function crm.tg_oauth_apps__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'oauth_app.registered', 'oauth_app', new.id,
                            jsonb_build_object('name', new.name, 'client_id', new.client_id, 'redirect_uris', to_jsonb(new.redirect_uris),
                                               'confidential', new.confidential));
  elsif tg_op = 'DELETE' then
    perform crm.audit_write(old.workspace_id, 'oauth_app.deleted', 'oauth_app', old.id, jsonb_build_object('name', old.name, 'client_id', old.client_id));
  elsif (old.name, old.redirect_uris, old.confidential, old.client_secret_hash) is distinct from
        (new.name, new.redirect_uris, new.confidential, new.client_secret_hash) then
    perform crm.audit_write(new.workspace_id, 'oauth_app.changed', 'oauth_app', new.id,
                            jsonb_build_object('name', new.name, 'redirect_uris', to_jsonb(new.redirect_uris), 'confidential', new.confidential,
                                               'secret_rotated', old.client_secret_hash is distinct from new.client_secret_hash));
  end if;
  return null;
end
$function$;
comment on function crm.tg_oauth_apps__audit() is
  'Audit: oauth_app.registered, oauth_app.changed (secret_rotated says whether the client secret changed, never the '
  'secret), oauth_app.deleted.';

create or replace function crm.tg_oauth_grants__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'oauth_grant.given', 'oauth_grant', new.id,
                            jsonb_build_object('app_id', new.app_id, 'user_id', new.user_id, 'scopes', to_jsonb(new.scopes)));
  elsif old.revoked_at is null and new.revoked_at is not null then
    perform crm.audit_write(new.workspace_id, 'oauth_grant.revoked', 'oauth_grant', new.id,
                            jsonb_build_object('app_id', new.app_id, 'user_id', new.user_id));
  elsif old.scopes is distinct from new.scopes then
    perform crm.audit_write(new.workspace_id, 'oauth_grant.changed', 'oauth_grant', new.id,
                            jsonb_build_object('app_id', new.app_id, 'user_id', new.user_id, 'scopes', to_jsonb(new.scopes),
                                               'previous_scopes', to_jsonb(old.scopes)));
  end if;
  return null;
end
$function$;
comment on function crm.tg_oauth_grants__audit() is 'Audit: oauth_grant.given, oauth_grant.changed (scopes), oauth_grant.revoked.';

create or replace function crm.tg_user_totp__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' or tg_op = 'UPDATE' then
    -- Enrolled by the operator (confirmed at once) or confirmed by the user.
    if new.confirmed_at is not null and (tg_op = 'INSERT' or old.confirmed_at is null) then
      perform crm.audit_write_for_user(new.user_id, 'two_factor.enabled', '{}');
    end if;
  elsif old.confirmed_at is not null then
    perform crm.audit_write_for_user(old.user_id, 'two_factor.disabled', '{}');
  end if;
  return null;
end
$function$;
comment on function crm.tg_user_totp__audit() is
  'Audit: two_factor.enabled (an enrollment confirmed), two_factor.disabled; never the TOTP secret.';

create or replace function crm.tg_users__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if old.api_access is distinct from new.api_access then
    perform crm.audit_write_for_user(new.id, 'user.api_access_changed', jsonb_build_object('api_access', new.api_access));
  end if;
  if (old.suspended_at is null) <> (new.suspended_at is null) then
    perform crm.audit_write_for_user(new.id, case when new.suspended_at is null then 'user.unsuspended' else 'user.suspended' end, '{}');
  end if;
  return null;
end
$function$;
comment on function crm.tg_users__audit() is
  'Audit (the operator''s changes): user.api_access_changed, user.suspended, user.unsuspended, in each of the user''s '
  'workspaces.';

create or replace function crm.tg_workspaces__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if (old.plan, old.seat_limit, old.trial_ends_at) is distinct from (new.plan, new.seat_limit, new.trial_ends_at) then
    perform crm.audit_write(new.id, 'workspace.plan_changed', 'workspace', new.id,
                            jsonb_build_object('plan', new.plan, 'seat_limit', new.seat_limit, 'trial_ends_at', crm.api_time(new.trial_ends_at),
                                               'previous', jsonb_build_object('plan', old.plan, 'seat_limit', old.seat_limit,
                                                                              'trial_ends_at', crm.api_time(old.trial_ends_at))));
  end if;
  return null;
end
$function$;
comment on function crm.tg_workspaces__audit() is 'Audit (the operator''s changes): workspace.plan_changed (plan, seat limit, trial end).';

create or replace function crm.tg_webhook_subscriptions__audit()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_row crm.webhook_subscriptions := case when tg_op = 'DELETE' then old else new end;
  -- The receiver's host only: a URL's path, query or user part may carry the receiver's own secret.
  v_about jsonb := jsonb_build_object('name', v_row.name, 'host', substring(v_row.url from '^[a-z]+://(?:[^@/?#]*@)?([^/:?#]+)'),
                                      'events', to_jsonb(v_row.events));
begin
  if tg_op = 'INSERT' then
    perform crm.audit_write(new.workspace_id, 'webhook.created', 'webhook', new.id, v_about);
  elsif tg_op = 'DELETE' then
    perform crm.audit_write(old.workspace_id, 'webhook.deleted', 'webhook', old.id, v_about);
  else
    if (old.name, old.url, old.events) is distinct from (new.name, new.url, new.events) then
      perform crm.audit_write(new.workspace_id, 'webhook.changed', 'webhook', new.id, v_about);
    end if;
    if old.status = 'active' and new.status = 'paused' then
      perform crm.audit_write(new.workspace_id, 'webhook.paused', 'webhook', new.id, v_about || jsonb_build_object('reason', new.paused_reason));
    elsif old.status = 'paused' and new.status = 'active' then
      perform crm.audit_write(new.workspace_id, 'webhook.resumed', 'webhook', new.id, v_about);
    end if;
    if old.secret_encrypted is distinct from new.secret_encrypted then
      perform crm.audit_write(new.workspace_id, 'webhook.secret_rotated', 'webhook', new.id, v_about);
    end if;
  end if;
  return null;
end
$function$;
comment on function crm.tg_webhook_subscriptions__audit() is
  'Audit: webhook.created, webhook.changed, webhook.deleted, webhook.paused (manual or auto), webhook.resumed, '
  'webhook.secret_rotated; the receiver''s host, never its URL''s path or the signing secret.';

create or replace function crm.tg_audit_log__append_only()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'DELETE' then
    if not exists (select 1 from crm.workspaces w where w.id = old.workspace_id)
       or current_setting('crm.audit_retention', true) = txid_current()::text
          and old.seq <= (select h.anchor_seq from crm.audit_chain_heads h where h.workspace_id = old.workspace_id) then
      return old;
    end if;
  end if;
  raise exception 'crm.% is append-only: no role may % it', tg_table_name, lower(tg_op)
    using errcode = 'CR403', hint = 'forbidden',
          detail = 'Entries older than AUDIT_RETENTION_DAYS are removed by crm.retire_audit_log only.';
end
$function$;
comment on function crm.tg_audit_log__append_only() is
  'Refuses every UPDATE, DELETE and TRUNCATE of crm.audit_log and crm.audit_chain_heads, the owner''s included, but '
  'the cascade of a deleted workspace and crm.retire_audit_log''s removal of entries up to the anchor it has just '
  'moved (a flag it sets for its own transaction).';

create or replace function crm.tg_audit_chain_heads__guard()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'UPDATE' then
    if (old.anchor_seq, old.anchor_hash) is not distinct from (new.anchor_seq, new.anchor_hash)
       and new.last_seq >= old.last_seq and old.workspace_id = new.workspace_id
       or current_setting('crm.audit_retention', true) = txid_current()::text then
      return new;
    end if;
  elsif not exists (select 1 from crm.workspaces w where w.id = old.workspace_id) then
    return old;
  end if;
  raise exception 'crm.audit_chain_heads moves forward only: its anchor moves by crm.retire_audit_log only'
    using errcode = 'CR403', hint = 'forbidden';
end
$function$;
comment on function crm.tg_audit_chain_heads__guard() is
  'A chain head''s sequence only grows, its anchor moves only in crm.retire_audit_log''s transaction, and it is '
  'deleted only with its workspace.';

create or replace function crm.retire_audit_log(p_retention_days integer)
 returns bigint
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_removed bigint := 0;
  v_count bigint;
  v_head record;
begin
  perform set_config('crm.audit_retention', txid_current()::text, true);
  for v_head in
    select h.workspace_id,
           (select l.seq from crm.audit_log l
             where l.workspace_id = h.workspace_id and l.occurred_at < now() - make_interval(days => p_retention_days)
             order by l.seq desc limit 1) as last_old_seq
      from crm.audit_chain_heads h
     order by h.workspace_id
  loop
    continue when v_head.last_old_seq is null;
    -- The last removed entry's hash becomes the anchor the first kept entry chains to.
    update crm.audit_chain_heads h
       set anchor_seq = l.seq, anchor_hash = l.hash
      from crm.audit_log l
     where h.workspace_id = v_head.workspace_id and l.workspace_id = v_head.workspace_id and l.seq = v_head.last_old_seq;
    delete from crm.audit_log l where l.workspace_id = v_head.workspace_id and l.seq <= v_head.last_old_seq;
    get diagnostics v_count = row_count;
    v_removed := v_removed + v_count;
    perform crm.audit_write(v_head.workspace_id, 'audit_log.retention_ran', 'workspace', v_head.workspace_id,
                            jsonb_build_object('removed', v_count, 'retention_days', p_retention_days,
                                               'anchor_seq', v_head.last_old_seq));
  end loop;
  perform set_config('crm.audit_retention', '', true);
  return v_removed;
end
$function$;
comment on function crm.retire_audit_log(p_retention_days integer) is
  'Worker only (housekeeping): removes each workspace''s audit entries older than p_retention_days '
  '(AUDIT_RETENTION_DAYS), keeps the last removed entry''s hash as the chain''s anchor, and records '
  'audit_log.retention_ran in each workspace it removed entries from; answers the entries removed.';
grant execute on function crm.retire_audit_log(p_retention_days integer) to crm_worker;

create or replace function crm.verify_audit_log(p_workspace_id uuid)
 returns table(intact boolean, entries bigint, first_bad_id uuid)
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_head crm.audit_chain_heads;
  v_seq bigint;
  v_hash bytea;
  v_entry crm.audit_log;
begin
  entries := 0;
  select h.* into v_head from crm.audit_chain_heads h where h.workspace_id = p_workspace_id;
  v_seq := coalesce(v_head.anchor_seq, 0);
  v_hash := coalesce(v_head.anchor_hash, decode(repeat('00', 32), 'hex'));
  for v_entry in select l.* from crm.audit_log l where l.workspace_id = p_workspace_id order by l.seq loop
    if v_entry.seq <> v_seq + 1 or v_entry.prev_hash <> v_hash or v_entry.hash <> crm.audit_hash(v_entry) then
      intact := false;
      first_bad_id := v_entry.id;
      return next;
      return;
    end if;
    v_seq := v_entry.seq;
    v_hash := v_entry.hash;
    entries := entries + 1;
  end loop;
  -- The newest entries removed: the head still names the last one written.
  if v_seq <> coalesce(v_head.last_seq, 0) or v_hash <> coalesce(v_head.last_hash, v_hash) then
    intact := false;
    first_bad_id := v_head.last_id;
    return next;
    return;
  end if;
  intact := true;
  return next;
end
$function$;
comment on function crm.verify_audit_log(p_workspace_id uuid) is
  'Walks a workspace''s audit chain from its anchor: intact and the entries checked, or the first entry whose '
  'sequence, previous hash or own hash is wrong (the head''s last entry when the newest were removed). Invoker''s '
  'rights: as crm_api, what the admin''s row-level security shows.';
grant execute on function crm.verify_audit_log(p_workspace_id uuid) to crm_api;

comment on table crm.audit_log is
  'The access audit log (docs/api.md section 11): who changed who may do what, written by triggers in the change''s '
  'transaction, append-only, chained per workspace (hash = SHA-256(prev_hash || crm.audit_canonical(entry))).';
create policy audit_log_all_owner on crm.audit_log as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy audit_log_all_owner on crm.audit_log is
  'The tables'' owner reaches every row (the audit triggers still refuse its updates and deletes).';
create policy audit_log_select_admin on crm.audit_log as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy audit_log_select_admin on crm.audit_log is
  'The workspace''s admins read its audit log (a scoped token needs workspace:admin).';
grant select on crm.audit_log to crm_api;
CREATE TRIGGER tg_audit_log__append_only BEFORE UPDATE OR DELETE ON crm.audit_log
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_audit_log__append_only();
CREATE TRIGGER tg_audit_log__no_truncate BEFORE TRUNCATE ON crm.audit_log
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_audit_log__append_only();

comment on table crm.audit_chain_heads is
  'Per workspace: the audit chain''s last entry (seq, id, hash; its row lock orders the workspace''s writers) and '
  'the anchor, the hash of the last entry retention removed.';
create policy audit_chain_heads_all_owner on crm.audit_chain_heads as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy audit_chain_heads_all_owner on crm.audit_chain_heads is
  'The tables'' owner reaches every row (the guard trigger still keeps the chain moving forward).';
create policy audit_chain_heads_select_admin on crm.audit_chain_heads as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy audit_chain_heads_select_admin on crm.audit_chain_heads is
  'The workspace''s admins read its chain head, so that they can verify the chain.';
grant select on crm.audit_chain_heads to crm_api;
CREATE TRIGGER tg_audit_chain_heads__guard BEFORE UPDATE OR DELETE ON crm.audit_chain_heads
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_audit_chain_heads__guard();
CREATE TRIGGER tg_audit_chain_heads__no_truncate BEFORE TRUNCATE ON crm.audit_chain_heads
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_audit_log__append_only();

CREATE TRIGGER tg_memberships__audit AFTER INSERT OR DELETE OR UPDATE OF role_id, suspended_at ON crm.memberships
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_memberships__audit();
CREATE TRIGGER tg_roles__audit AFTER INSERT OR DELETE OR UPDATE OF name, is_admin ON crm.roles
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_roles__audit();
CREATE TRIGGER tg_role_grants__audit_insert AFTER INSERT ON crm.role_grants
  REFERENCING NEW TABLE AS new_table
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_role_grants__audit();
CREATE TRIGGER tg_role_grants__audit_update AFTER UPDATE ON crm.role_grants
  REFERENCING OLD TABLE AS old_table NEW TABLE AS new_table
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_role_grants__audit();
CREATE TRIGGER tg_role_grants__audit_delete AFTER DELETE ON crm.role_grants
  REFERENCING OLD TABLE AS old_table
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_role_grants__audit();
CREATE TRIGGER tg_teams__audit AFTER INSERT OR DELETE OR UPDATE OF name ON crm.teams
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_teams__audit();
CREATE TRIGGER tg_team_members__audit AFTER INSERT OR DELETE ON crm.team_members
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_team_members__audit();
CREATE TRIGGER tg_invitations__audit AFTER INSERT OR DELETE OR UPDATE OF accepted_at ON crm.invitations
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_invitations__audit();
CREATE TRIGGER tg_tokens__audit_insert AFTER INSERT ON crm.tokens
  FOR EACH ROW
  WHEN ((new.kind <> 'oauth'::text))
  EXECUTE FUNCTION crm.tg_tokens__audit();
CREATE TRIGGER tg_tokens__audit_revoke AFTER UPDATE OF revoked_at ON crm.tokens
  FOR EACH ROW
  WHEN (((new.kind <> 'oauth'::text) AND (old.revoked_at IS NULL) AND (new.revoked_at IS NOT NULL)))
  EXECUTE FUNCTION crm.tg_tokens__audit();
CREATE TRIGGER tg_oauth_apps__audit AFTER INSERT OR DELETE OR UPDATE ON crm.oauth_apps
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_oauth_apps__audit();
CREATE TRIGGER tg_oauth_grants__audit AFTER INSERT OR UPDATE OF revoked_at, scopes ON crm.oauth_grants
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_oauth_grants__audit();
CREATE TRIGGER tg_user_totp__audit AFTER INSERT OR DELETE OR UPDATE OF confirmed_at ON crm.user_totp
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_user_totp__audit();
CREATE TRIGGER tg_users__audit AFTER UPDATE OF api_access, suspended_at ON crm.users
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_users__audit();
CREATE TRIGGER tg_workspaces__audit AFTER UPDATE OF plan, seat_limit, trial_ends_at ON crm.workspaces
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_workspaces__audit();
CREATE TRIGGER tg_webhook_subscriptions__audit AFTER INSERT OR DELETE OR UPDATE ON crm.webhook_subscriptions
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_webhook_subscriptions__audit();
