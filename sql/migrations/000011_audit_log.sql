-- The access audit log (docs/api.md section 11): one row per change to who may do what, written by
-- triggers in the change's transaction, chained per workspace by SHA-256, append-only. Its head per
-- workspace is a row of its own, so that writers of one workspace queue on that row and writers of
-- different workspaces never wait for each other.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.audit_log (
  workspace_id uuid not null,
  seq bigint not null,
  id uuid default crm.uuid_v7() not null,
  occurred_at timestamp with time zone default now() not null,
  action text not null,
  actor_user_id uuid,
  actor_via text not null,
  actor_token_id uuid,
  actor_app_id uuid,
  actor_ip inet,
  target_type text not null,
  target_id uuid,
  details jsonb default '{}'::jsonb not null,
  prev_hash bytea not null,
  hash bytea not null,
  constraint audit_log_pkey PRIMARY KEY (workspace_id, seq),
  constraint audit_log_id_key UNIQUE (workspace_id, id),
  constraint audit_log_action_format CHECK ((action ~ '^[a-z_]+\.[a-z_]+$'::text)),
  constraint audit_log_hash_length CHECK (((length(hash) = 32) AND (length(prev_hash) = 32))),
  constraint audit_log_details_object CHECK ((jsonb_typeof(details) = 'object'::text))
);
CREATE INDEX audit_log_occurred_idx ON crm.audit_log USING btree (workspace_id, occurred_at);
alter table crm.audit_log enable row level security;
alter table crm.audit_log force row level security;

create table crm.audit_chain_heads (
  workspace_id uuid not null,
  last_seq bigint default 0 not null,
  last_id uuid,
  last_hash bytea not null,
  anchor_seq bigint default 0 not null,
  anchor_hash bytea not null,
  constraint audit_chain_heads_pkey PRIMARY KEY (workspace_id),
  constraint audit_chain_heads_anchor_behind CHECK ((anchor_seq <= last_seq))
);
alter table crm.audit_chain_heads enable row level security;
alter table crm.audit_chain_heads force row level security;

alter table crm.audit_log
  add constraint audit_log_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.audit_chain_heads
  add constraint audit_chain_heads_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
