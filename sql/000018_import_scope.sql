-- Imports: the permission scope of a whole batch, judged by the same helpers as the policies.

-- ---------------------------------------------------------------------------------------------
-- Owners a scope does not cover, for a set of owners at once
-- ---------------------------------------------------------------------------------------------

-- An import reports, row by row, the owners its scopes refuse (a new record's owner under the
-- import grant; a matched record's owner, and its new owner, under the update grant) before it
-- writes anything, so that the batch's other rows still land. The rule is the policies' own:
-- crm.grant_scope is 'all', or the owner is one of crm.scope_owner_ids. A batch passes its
-- distinct owners and calls this once per statement (as an InitPlan), never once per row: each
-- helper verifies the context's HMAC proof.
create or replace function crm.owners_outside_scope(p_resource text, p_action text, p_owner_ids uuid[]) returns uuid[]
language plpgsql stable
set search_path = pg_catalog, public
as $$
declare
  v_covered uuid[];
begin
  if crm.grant_scope(p_resource, p_action) = 'all' then
    return '{}';
  end if;
  v_covered := crm.scope_owner_ids(p_resource, p_action);
  return array(select distinct o.owner_id
                 from unnest(p_owner_ids) as o (owner_id)
                where o.owner_id is not null and o.owner_id <> all (v_covered)
                order by o.owner_id);
end
$$;
comment on function crm.owners_outside_scope(text, text, uuid[]) is
  'The owners among p_owner_ids (nulls left out) whose records the current member''s resource:action scope does not cover: none for all, every one without a grant.';
grant execute on function crm.owners_outside_scope(text, text, uuid[]) to crm_api;
