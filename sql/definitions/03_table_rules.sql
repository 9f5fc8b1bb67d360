-- What the tables' checks and indexes call: the validators of custom fields, scopes, event patterns
-- and redirect URIs, and the search texts the trigram indexes are built on, with what they call. They read no table, so
-- on a new database `crm migrate` applies this file right after migration 000001, before the tables
-- that call them; changing what one answers needs a numbered migration too (revalidate or reindex).
-- needs migration 1

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.known_scopes()
 returns text[]
 language sql
 immutable parallel safe
as $function$
  select array['contacts:read', 'contacts:write', 'companies:read', 'companies:write', 'deals:read', 'deals:write',
               'webhooks:manage', 'workspace:admin', 'offline_access']
$function$;
comment on function crm.known_scopes() is
  'Every scope a token may carry (docs/api.md section 4a), in the order the documentation lists them.';
grant execute on function crm.known_scopes() to crm_api;

create or replace function crm.digits(value text)
 returns text
 language sql
 immutable parallel safe
as $function$
  select nullif(regexp_replace(value, '[^0-9]', '', 'g'), '')
$function$;
comment on function crm.digits(value text) is
  'The digits of a phone number, so search matches "+1 (555) 010-0199" when given 5550100199.';
grant execute on function crm.digits(value text) to crm_api;

create or replace function crm.scopes_are_valid(p_scopes text[])
 returns boolean
 language sql
 immutable parallel safe
as $function$
  select cardinality(p_scopes) between 1 and 9
     and p_scopes <@ crm.known_scopes()
     and array_position(p_scopes, null) is null
     and cardinality(p_scopes) = (select count(distinct s) from unnest(p_scopes) s)
$function$;
comment on function crm.scopes_are_valid(p_scopes text[]) is
  'CHECK for a token''s scopes: 1 to 9 known scopes, no null, no repeat.';
grant execute on function crm.scopes_are_valid(p_scopes text[]) to crm_api;

create or replace function crm.custom_fields_entries_are_valid(fields jsonb)
 returns boolean
 language sql
 immutable parallel safe
as $function$
  select jsonb_typeof(fields) = 'object'
     and (select count(*) <= 50
                 and coalesce(bool_and(key ~ '^[a-z][a-z0-9_]{0,62}$'
                                       and jsonb_typeof(value) in ('string', 'number', 'boolean', 'null')), true)
            from jsonb_each(fields))
$function$;
comment on function crm.custom_fields_entries_are_valid(fields jsonb) is
  'The full custom_fields check: an object of at most 50 keys matching ^[a-z][a-z0-9_]{0,62}$ whose values are '
  'strings, numbers, booleans or null.';
grant execute on function crm.custom_fields_entries_are_valid(fields jsonb) to crm_api;

create or replace function crm.custom_fields_are_valid(fields jsonb)
 returns boolean
 language sql
 immutable parallel safe
return ((fields = '{}'::jsonb) OR crm.custom_fields_entries_are_valid(fields));
comment on function crm.custom_fields_are_valid(fields jsonb) is
  'CHECK for custom_fields: an object of at most 50 keys matching ^[a-z][a-z0-9_]{0,62}$ whose values are strings, '
  'numbers, booleans or null. The empty object is answered inline (no per-row executor).';
grant execute on function crm.custom_fields_are_valid(fields jsonb) to crm_api;

create or replace function crm.contact_search_text(first_name text, last_name text, email text, phone text)
 returns text
 language sql
 immutable parallel safe
as $function$
  select lower(coalesce(first_name, '') || ' ' || coalesce(last_name, '') || ' ' || coalesce(email, '') || ' ' || coalesce(crm.digits(phone), ''))
$function$;
comment on function crm.contact_search_text(first_name text, last_name text, email text, phone text) is
  'The text search matches for a contact: names, email and phone digits, lower-case.';
grant execute on function crm.contact_search_text(first_name text, last_name text, email text, phone text) to crm_api;

create or replace function crm.company_search_text(name text, domain text, phone text)
 returns text
 language sql
 immutable parallel safe
as $function$
  select lower(coalesce(name, '') || ' ' || coalesce(domain, '') || ' ' || coalesce(crm.digits(phone), ''))
$function$;
comment on function crm.company_search_text(name text, domain text, phone text) is
  'The text search matches for a company: name, domain and phone digits, lower-case.';
grant execute on function crm.company_search_text(name text, domain text, phone text) to crm_api;

create or replace function crm.deal_search_text(name text)
 returns text
 language sql
 immutable parallel safe
as $function$
  select lower(name)
$function$;
comment on function crm.deal_search_text(name text) is 'The text search matches for a deal: its name, lower-case.';
grant execute on function crm.deal_search_text(name text) to crm_api;

create or replace function crm.webhook_event_patterns_are_valid(patterns text[])
 returns boolean
 language sql
 immutable parallel safe
as $function$
  select coalesce(bool_and(p ~ '^(\*|(contact|company|deal)\.(\*|created|updated|deleted))$'), false)
    from unnest(patterns) p
$function$;
comment on function crm.webhook_event_patterns_are_valid(patterns text[]) is
  'CHECK for events: each entry an event name, contact.*, company.*, deal.* or *.';
grant execute on function crm.webhook_event_patterns_are_valid(patterns text[]) to crm_api;

create or replace function crm.oauth_redirect_uris_are_valid(uris text[])
 returns boolean
 language sql
 immutable parallel safe
as $function$
  select coalesce(bool_and(length(u) <= 2000 and position('#' in u) = 0
                           and (u ~ '^https://[^/?#@\s]+(/[^\s]*)?$' or u ~ '^http://(127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?(/[^\s]*)?$')), false)
    from unnest(uris) u
$function$;
comment on function crm.oauth_redirect_uris_are_valid(uris text[]) is
  'CHECK for redirect URIs: https, or http on 127.0.0.1 or [::1] (loopback, any port at authorization); no fragment, '
  'no spaces.';
grant execute on function crm.oauth_redirect_uris_are_valid(uris text[]) to crm_api;
