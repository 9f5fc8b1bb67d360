-- Sign-in and UI sessions: one-use tickets, two-factor enrollment and challenges, recovery codes,
-- attempt limits.
-- The first migrations make every table and index of the schema by area, as they stood when the
-- numbered files were folded; later ones change them. Functions, views, policies, triggers, grants
-- and comments are not here: each is defined once in sql/definitions/ (sql/CONVENTIONS.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.attempt_counters (
  purpose text not null,
  subject text not null,
  attempts integer not null,
  window_id uuid default crm.uuid_v7() not null,
  window_ends_at timestamp with time zone not null,
  constraint attempt_counters_pkey PRIMARY KEY (purpose, subject),
  constraint attempt_counters_attempts_not_negative CHECK ((attempts >= 0)),
  constraint attempt_counters_purpose_known CHECK ((purpose = ANY (ARRAY['sign_in'::text, 'two_factor'::text])))
);
alter table crm.attempt_counters enable row level security;
alter table crm.attempt_counters force row level security;
CREATE INDEX attempt_counters_window_ends_at_idx ON crm.attempt_counters USING btree (window_ends_at);

create unlogged table crm.sign_in_tickets (
  id uuid default gen_random_uuid() not null,
  email text not null,
  window_id uuid not null,
  expires_at timestamp with time zone not null,
  constraint sign_in_tickets_pkey PRIMARY KEY (id)
);
alter table crm.sign_in_tickets enable row level security;
alter table crm.sign_in_tickets force row level security;
CREATE INDEX sign_in_tickets_expires_at_idx ON crm.sign_in_tickets USING btree (expires_at);

create table crm.user_totp (
  user_id uuid not null,
  secret_encrypted bytea not null,
  confirmed_at timestamp with time zone,
  created_at timestamp with time zone default now() not null,
  last_used_step bigint,
  constraint user_totp_pkey PRIMARY KEY (user_id)
);
alter table crm.user_totp enable row level security;
alter table crm.user_totp force row level security;

create table crm.recovery_codes (
  user_id uuid not null,
  code_hash bytea not null,
  used_at timestamp with time zone,
  constraint recovery_codes_pkey PRIMARY KEY (user_id, code_hash)
);
alter table crm.recovery_codes enable row level security;
alter table crm.recovery_codes force row level security;

create table crm.two_factor_challenges (
  id uuid default crm.uuid_v7() not null,
  user_id uuid not null,
  device_name text not null,
  attempts integer default 0 not null,
  expires_at timestamp with time zone not null,
  completed_at timestamp with time zone,
  constraint two_factor_challenges_pkey PRIMARY KEY (id)
);
alter table crm.two_factor_challenges enable row level security;
alter table crm.two_factor_challenges force row level security;

-- Foreign keys

alter table crm.recovery_codes
  add constraint recovery_codes_user_id_fkey FOREIGN KEY (user_id)
  REFERENCES crm.users(id) ON DELETE CASCADE;
alter table crm.two_factor_challenges
  add constraint two_factor_challenges_user_id_fkey FOREIGN KEY (user_id)
  REFERENCES crm.users(id) ON DELETE CASCADE;
alter table crm.user_totp
  add constraint user_totp_user_id_fkey FOREIGN KEY (user_id)
  REFERENCES crm.users(id) ON DELETE CASCADE;
