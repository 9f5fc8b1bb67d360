-- Functions nothing calls any more go, no function of crm stays executable by PUBLIC, and
-- crm.team_user_ids is the owner's, as its comment says.
--
-- Each dropped function is referenced by no other function, policy, trigger, default, check,
-- view or index, by no code of the service or the worker, and by no test but one of itself:
--   crm.member_scope: grant_scope and scope_owner_ids read the grants crm.put_context wrote
--     into the request context (000025), not the member's role.
--   crm.context_field, crm.proven_context: the policy helpers read each field of the context in
--     one level (000025) instead.
--   crm.current_team_user_ids: no policy asks for the team; crm.scope_owner_ids answers it.
--   crm.context_message, crm.context_proof (both forms each), crm.set_context(uuid, uuid, text):
--     the keyed proof is computed inside crm.install_context_carrier's reader and writer, and
--     the context is set with its scopes and OAuth app (the five-argument crm.set_context).
--   crm.token_user: crm.accept_invitation checks its bearer itself (000021).
set local lock_timeout = '5s';
set local statement_timeout = '60s';

drop function crm.member_scope(uuid, uuid, text, text);
drop function crm.context_field(integer);
drop function crm.proven_context();
drop function crm.current_team_user_ids();
drop function crm.set_context(uuid, uuid, text);
drop function crm.context_proof(uuid, uuid);
drop function crm.context_proof(uuid, uuid, text[], uuid);
drop function crm.context_message(text, text);
drop function crm.context_message(text, text, text, text);
drop function crm.token_user(bytea);

-- Trigger functions need no EXECUTE to fire; these two (000012) kept PUBLIC's.
revoke execute on function crm.tg_oauth_grants__revoke_tokens() from public;
revoke execute on function crm.tg_tokens__revoke_oauth_grant() from public;

-- 000009 gave crm_api every function PUBLIC could run then, crm.team_user_ids among them; only
-- crm.put_context (the owner's) calls it.
revoke execute on function crm.team_user_ids(uuid, uuid) from crm_api;
