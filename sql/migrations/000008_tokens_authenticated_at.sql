-- When each token's chain began with a password or two-factor sign-in: a request that makes a
-- token lasting more than a day needs one within ten minutes (crm.tg_tokens__authenticated_at).
-- Tokens made before this column start at -infinity, so they count as signed in long ago.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- squawk-ignore adding-not-nullable-field
alter table crm.tokens add column authenticated_at timestamp with time zone not null default '-infinity';
alter table crm.tokens alter column authenticated_at set default now();
