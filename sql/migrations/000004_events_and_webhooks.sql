-- Events and webhooks: the outbox, subscriptions, deliveries and their attempts.
-- The first migrations make every table and index of the schema by area, as they stood when the
-- numbered files were folded; later ones change them. Functions, views, policies, triggers, grants
-- and comments are not here: each is defined once in sql/definitions/ (sql/CONVENTIONS.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.events (
  workspace_id uuid not null,
  id uuid default crm.uuid_v7() not null,
  event text not null,
  record_type text not null,
  record_id uuid not null,
  occurred_at timestamp with time zone default now() not null,
  data jsonb not null,
  actor jsonb not null,
  constraint events_pkey PRIMARY KEY (workspace_id, id),
  constraint events_actor_shape CHECK (
    (((actor ->> 'type'::text) = ANY (ARRAY['user'::text, 'system'::text])) AND (actor ? 'via'::text))
  ),
  constraint events_data_has_object CHECK ((jsonb_typeof((data -> 'object'::text)) = 'object'::text)),
  constraint events_event_format CHECK ((event ~ '^(contact|company|deal)\.(created|updated|deleted)$'::text)),
  constraint events_record_type_check CHECK (
    (record_type = ANY (ARRAY['contact'::text, 'company'::text, 'deal'::text]))
  )
);
alter table crm.events enable row level security;
alter table crm.events force row level security;
CREATE INDEX events_occurred_at ON crm.events USING btree (occurred_at);
CREATE INDEX events_record ON crm.events USING btree (workspace_id, record_type, record_id, id);
CREATE INDEX webhook_events_id ON crm.events USING btree (id);

create table crm.webhook_subscriptions (
  workspace_id uuid default crm.current_workspace_id() not null,
  id uuid default crm.uuid_v7() not null,
  name text not null,
  url text not null,
  events text[] not null,
  status text default 'active'::text not null,
  paused_reason text,
  paused_at timestamp with time zone,
  secret_encrypted bytea not null,
  secret_last4 text not null,
  previous_secret_encrypted bytea,
  previous_secret_expires_at timestamp with time zone,
  created_at timestamp with time zone default now() not null,
  updated_at timestamp with time zone default now() not null,
  created_by uuid default crm.current_user_id(),
  constraint webhook_subscriptions_pkey PRIMARY KEY (workspace_id, id),
  constraint webhook_subscriptions_events_valid check (cardinality(events) between 1 and 20 and crm.webhook_event_patterns_are_valid(events)),
  constraint webhook_subscriptions_name_length CHECK (((length(btrim(name)) >= 1) AND (length(btrim(name)) <= 255))),
  constraint webhook_subscriptions_paused_consistent CHECK (
    (((status = 'paused'::text) = (paused_reason IS NOT NULL))
     AND ((status = 'paused'::text) = (paused_at IS NOT NULL)))
  ),
  constraint webhook_subscriptions_paused_reason_known CHECK (
    (paused_reason = ANY (ARRAY['manual'::text, 'auto'::text]))
  ),
  constraint webhook_subscriptions_previous_secret_consistent CHECK (
    ((previous_secret_encrypted IS NULL) = (previous_secret_expires_at IS NULL))
  ),
  constraint webhook_subscriptions_secret_last4_length CHECK ((length(secret_last4) = 4)),
  constraint webhook_subscriptions_status_known CHECK ((status = ANY (ARRAY['active'::text, 'paused'::text]))),
  constraint webhook_subscriptions_url_length CHECK (((length(url) >= 1) AND (length(url) <= 2048)))
);
alter table crm.webhook_subscriptions enable row level security;
alter table crm.webhook_subscriptions force row level security;

create table crm.webhook_deliveries (
  workspace_id uuid not null,
  id uuid default crm.uuid_v7() not null,
  subscription_id uuid not null,
  event_id uuid not null,
  event text not null,
  record_type text not null,
  record_id uuid not null,
  status text default 'pending'::text not null,
  attempt_count integer default 0 not null,
  cycle_attempts integer default 0 not null,
  next_attempt_at timestamp with time zone,
  generation integer default 1 not null,
  in_release boolean default false not null,
  created_at timestamp with time zone default now() not null,
  updated_at timestamp with time zone default now() not null,
  completed_at timestamp with time zone,
  is_test boolean default false not null,
  test_event jsonb,
  constraint webhook_deliveries_pkey PRIMARY KEY (workspace_id, id),
  constraint webhook_deliveries_attempt_count_check CHECK ((attempt_count >= 0)),
  constraint webhook_deliveries_completed_when_final CHECK (
    ((status = ANY (ARRAY['delivered'::text, 'dead'::text])) = (completed_at IS NOT NULL))
  ),
  constraint webhook_deliveries_cycle_attempts_check CHECK ((cycle_attempts >= 0)),
  constraint webhook_deliveries_status_known CHECK (
    (status = ANY (ARRAY['pending'::text, 'retrying'::text, 'delivered'::text, 'dead'::text, 'held'::text]))
  ),
  constraint webhook_deliveries_test_event_consistent CHECK ((((test_event IS NOT NULL) = is_test) AND ((test_event IS NULL) OR ((jsonb_typeof(((test_event -> 'data'::text) -> 'object'::text)) = 'object'::text) AND (jsonb_typeof((test_event -> 'actor'::text)) = 'object'::text))))) NOT VALID
);
alter table crm.webhook_deliveries enable row level security;
alter table crm.webhook_deliveries force row level security;
CREATE INDEX webhook_deliveries_completed ON crm.webhook_deliveries
  USING btree (workspace_id, subscription_id, completed_at)
  WHERE (completed_at IS NOT NULL);
CREATE INDEX webhook_deliveries_held ON crm.webhook_deliveries
  USING btree (workspace_id, subscription_id, event_id)
  WHERE ((status = 'held'::text) OR in_release);
CREATE INDEX webhook_deliveries_log ON crm.webhook_deliveries USING btree (workspace_id, subscription_id, id DESC);
CREATE UNIQUE INDEX webhook_deliveries_subscription_event ON crm.webhook_deliveries
  USING btree (workspace_id, subscription_id, event_id);

create type crm.webhook_attempt_result as (delivery_id uuid, event_id uuid, generation integer, started_at timestamp with time zone, duration_ms integer, response_status integer, error text, response_body_excerpt text, signature text);

create table crm.webhook_attempts (
  workspace_id uuid not null,
  delivery_id uuid not null,
  attempt integer not null,
  started_at timestamp with time zone not null,
  duration_ms integer not null,
  response_status integer,
  error text,
  response_body_excerpt text,
  signature text,
  constraint webhook_attempts_pkey PRIMARY KEY (workspace_id, delivery_id, attempt),
  constraint webhook_attempts_attempt_positive CHECK ((attempt >= 1)),
  constraint webhook_attempts_duration_check CHECK ((duration_ms >= 0)),
  constraint webhook_attempts_error_known CHECK (
    (error = ANY (ARRAY['timeout'::text, 'connection_refused'::text, 'dns_failed'::text, 'address_refused'::text,
                        'tls_error'::text, 'redirect'::text, 'http_status'::text]))
  ),
  constraint webhook_attempts_excerpt_length CHECK ((octet_length(response_body_excerpt) <= 8192))
);
alter table crm.webhook_attempts enable row level security;
alter table crm.webhook_attempts force row level security;

create table crm.webhook_operation_counts (
  workspace_id uuid not null,
  subscription_id uuid not null,
  operation text not null,
  window_ends_at timestamp with time zone not null,
  count integer not null,
  constraint webhook_operation_counts_pkey PRIMARY KEY (workspace_id, subscription_id, operation),
  constraint webhook_operation_counts_count_positive CHECK ((count >= 1)),
  constraint webhook_operation_counts_operation_known CHECK ((operation = ANY (ARRAY['test'::text, 'recover'::text])))
);
alter table crm.webhook_operation_counts enable row level security;
alter table crm.webhook_operation_counts force row level security;

-- Foreign keys

alter table crm.events
  add constraint events_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.webhook_attempts
  add constraint webhook_attempts_delivery_fkey FOREIGN KEY (workspace_id, delivery_id)
  REFERENCES crm.webhook_deliveries(workspace_id, id) ON DELETE CASCADE;
alter table crm.webhook_deliveries
  add constraint webhook_deliveries_subscription_fkey FOREIGN KEY (workspace_id, subscription_id)
  REFERENCES crm.webhook_subscriptions(workspace_id, id) ON DELETE CASCADE;
alter table crm.webhook_operation_counts
  add constraint webhook_operation_counts_subscription_fkey FOREIGN KEY (workspace_id, subscription_id)
  REFERENCES crm.webhook_subscriptions(workspace_id, id) ON DELETE CASCADE;
alter table crm.webhook_subscriptions
  add constraint webhook_subscriptions_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
