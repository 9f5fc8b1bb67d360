-- Imports: the imports, their staged rows and errors.
-- The first migrations make every table and index of the schema by area, as they stood when the
-- numbered files were folded; later ones change them. Functions, views, policies, triggers, grants
-- and comments are not here: each is defined once in sql/definitions/ (sql/CONVENTIONS.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.imports (
  workspace_id uuid default crm.current_workspace_id() not null,
  id uuid default crm.uuid_v7() not null,
  user_id uuid default crm.current_user_id() not null,
  record_type text not null,
  file_name text,
  file_bytes bytea,
  file_size bigint not null,
  delimiter text not null,
  columns text[] not null,
  row_count integer not null,
  sample_rows jsonb not null,
  suggested_mapping jsonb not null,
  status text default 'uploaded'::text not null,
  mapping jsonb,
  mode text,
  match_on text,
  dry_run boolean default false not null,
  staged boolean default false not null,
  last_row_done integer default 0 not null,
  created integer default 0 not null,
  updated integer default 0 not null,
  skipped integer default 0 not null,
  failed integer default 0 not null,
  companies_created integer default 0 not null,
  failure text,
  created_at timestamp with time zone default now() not null,
  queued_at timestamp with time zone,
  started_at timestamp with time zone,
  finished_at timestamp with time zone,
  token_scopes text[],
  oauth_app_id uuid,
  token_id uuid,
  failure_code text,
  constraint imports_pkey PRIMARY KEY (workspace_id, id),
  constraint imports_delimiter_known CHECK ((delimiter = ANY (ARRAY[','::text, ';'::text, '	'::text]))),
  constraint imports_file_name_length CHECK (((length(file_name) >= 1) AND (length(file_name) <= 255))),
  constraint imports_file_size_check CHECK ((file_size >= 0)),
  constraint imports_match_on_known CHECK ((match_on = ANY (ARRAY['email'::text, 'domain'::text, 'id'::text]))),
  constraint imports_mode_known CHECK ((mode = ANY (ARRAY['create'::text, 'upsert'::text]))),
  constraint imports_record_type_known CHECK (
    (record_type = ANY (ARRAY['contacts'::text, 'companies'::text, 'deals'::text]))
  ),
  constraint imports_row_count_check CHECK ((row_count >= 0)),
  constraint imports_status_known CHECK (
    (status = ANY (ARRAY['uploaded'::text, 'queued'::text, 'processing'::text, 'completed'::text, 'failed'::text]))
  )
);
alter table crm.imports enable row level security;
alter table crm.imports force row level security;
alter table crm.imports alter column file_bytes set storage external;
CREATE INDEX imports_created_at ON crm.imports USING btree (created_at);

create table crm.import_rows (
  workspace_id uuid not null,
  import_id uuid not null,
  "row" integer not null,
  user_id uuid not null,
  cells text[] not null,
  repeat_of integer,
  constraint import_rows_pkey PRIMARY KEY (workspace_id, import_id, "row")
);
alter table crm.import_rows enable row level security;
alter table crm.import_rows force row level security;

create table crm.import_errors (
  workspace_id uuid not null,
  import_id uuid not null,
  "row" integer not null,
  "position" integer not null,
  user_id uuid not null,
  column_name text,
  field text,
  message text not null,
  constraint import_errors_pkey PRIMARY KEY (workspace_id, import_id, "row", "position")
);
alter table crm.import_errors enable row level security;
alter table crm.import_errors force row level security;

-- Foreign keys

alter table crm.import_errors
  add constraint import_errors_workspace_id_import_id_fkey FOREIGN KEY (workspace_id, import_id)
  REFERENCES crm.imports(workspace_id, id) ON DELETE CASCADE;
alter table crm.import_rows
  add constraint import_rows_workspace_id_import_id_fkey FOREIGN KEY (workspace_id, import_id)
  REFERENCES crm.imports(workspace_id, id) ON DELETE CASCADE;
alter table crm.imports
  add constraint imports_user_fkey FOREIGN KEY (workspace_id, user_id)
  REFERENCES crm.memberships(workspace_id, user_id) ON DELETE CASCADE;
alter table crm.imports
  add constraint imports_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
