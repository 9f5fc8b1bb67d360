-- Records: contacts, companies, deals, deal stages, associations and idempotency keys.
-- The first migrations make every table and index of the schema by area, as they stood when the
-- numbered files were folded; later ones change them. Functions, views, policies, triggers, grants
-- and comments are not here: each is defined once in sql/definitions/ (sql/CONVENTIONS.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.contacts (
  workspace_id uuid default crm.current_workspace_id() not null,
  id uuid default crm.uuid_v7() not null,
  owner_id uuid default crm.current_user_id() not null,
  first_name text,
  last_name text,
  email text,
  phone text,
  job_title text,
  city text,
  country text,
  company_id uuid,
  custom_fields jsonb default '{}'::jsonb not null,
  created_at timestamp with time zone default now() not null,
  updated_at timestamp with time zone default now() not null,
  created_by uuid default crm.current_user_id(),
  updated_by uuid default crm.current_user_id(),
  constraint contacts_pkey PRIMARY KEY (workspace_id, id),
  constraint contacts_city_length CHECK (((length(city) >= 1) AND (length(city) <= 100))),
  constraint contacts_country_length CHECK (((length(country) >= 1) AND (length(country) <= 100))),
  constraint contacts_custom_fields_check CHECK (crm.custom_fields_are_valid(custom_fields)),
  constraint contacts_email_format CHECK (
    ((length(email) <= 254) AND (email ~ '^[^\s@]+@[^\s@]+\.[^\s@.]+$'::text) AND (email = lower(email)))
  ),
  constraint contacts_first_name_length CHECK (((length(first_name) >= 1) AND (length(first_name) <= 100))),
  constraint contacts_job_title_length CHECK (((length(job_title) >= 1) AND (length(job_title) <= 200))),
  constraint contacts_last_name_length CHECK (((length(last_name) >= 1) AND (length(last_name) <= 100))),
  constraint contacts_name_or_email CHECK (
    ((first_name IS NOT NULL) OR (last_name IS NOT NULL) OR (email IS NOT NULL))
  ),
  constraint contacts_phone_format CHECK (
    ((length(phone) <= 50) AND (phone ~* '^\+?[0-9 ().\-/]*[0-9][0-9 ().\-/]*( ?(x|ext\.?|#) ?[0-9]{1,10})?$'::text))
  )
);
alter table crm.contacts enable row level security;
alter table crm.contacts force row level security;
CREATE INDEX contacts_company ON crm.contacts USING btree (workspace_id, company_id);
CREATE INDEX contacts_created_at ON crm.contacts USING btree (workspace_id, created_at, id);
CREATE INDEX contacts_custom_fields ON crm.contacts USING gin (custom_fields jsonb_path_ops);
CREATE UNIQUE INDEX contacts_email_unique ON crm.contacts USING btree (workspace_id, email);
CREATE INDEX contacts_last_name ON crm.contacts USING btree (workspace_id, last_name, id);
CREATE INDEX contacts_owner ON crm.contacts USING btree (workspace_id, owner_id);
CREATE INDEX contacts_search_trigram ON crm.contacts
  USING gin (crm.contact_search_text(first_name, last_name, email, phone) gin_trgm_ops);
CREATE INDEX contacts_search_words ON crm.contacts
  USING gin (to_tsvector('simple'::regconfig, crm.contact_search_text(first_name, last_name, email, phone)));
CREATE INDEX contacts_updated_at ON crm.contacts USING btree (workspace_id, updated_at, id);

create table crm.companies (
  workspace_id uuid default crm.current_workspace_id() not null,
  id uuid default crm.uuid_v7() not null,
  owner_id uuid default crm.current_user_id() not null,
  name text not null,
  domain text,
  website text,
  industry text,
  phone text,
  city text,
  country text,
  employee_count integer,
  annual_revenue numeric(18,2),
  description text,
  custom_fields jsonb default '{}'::jsonb not null,
  created_at timestamp with time zone default now() not null,
  updated_at timestamp with time zone default now() not null,
  created_by uuid default crm.current_user_id(),
  updated_by uuid default crm.current_user_id(),
  constraint companies_pkey PRIMARY KEY (workspace_id, id),
  constraint companies_annual_revenue_check CHECK ((annual_revenue >= (0)::numeric)),
  constraint companies_city_length CHECK (((length(city) >= 1) AND (length(city) <= 100))),
  constraint companies_country_length CHECK (((length(country) >= 1) AND (length(country) <= 100))),
  constraint companies_custom_fields_check CHECK (crm.custom_fields_are_valid(custom_fields)),
  constraint companies_description_length CHECK ((length(description) <= 10000)),
  constraint companies_domain_format CHECK (
    ((length(domain) <= 253)
     AND (domain ~ '^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?$'::text))
  ),
  constraint companies_employee_count_check CHECK ((employee_count >= 0)),
  constraint companies_industry_length CHECK (((length(industry) >= 1) AND (length(industry) <= 100))),
  constraint companies_name_length CHECK (((length(name) >= 1) AND (length(name) <= 255))),
  constraint companies_phone_format CHECK (
    ((length(phone) <= 50) AND (phone ~* '^\+?[0-9 ().\-/]*[0-9][0-9 ().\-/]*( ?(x|ext\.?|#) ?[0-9]{1,10})?$'::text))
  ),
  constraint companies_website_format CHECK (
    ((length(website) <= 2048) AND (website ~* '^https?://[^\s/?#]+[^\s]*$'::text))
  )
);
alter table crm.companies enable row level security;
alter table crm.companies force row level security;
CREATE INDEX companies_created_at ON crm.companies USING btree (workspace_id, created_at, id);
CREATE INDEX companies_custom_fields ON crm.companies USING gin (custom_fields jsonb_path_ops);
CREATE UNIQUE INDEX companies_domain_unique ON crm.companies USING btree (workspace_id, domain);
CREATE INDEX companies_name ON crm.companies USING btree (workspace_id, name, id);
CREATE INDEX companies_name_lower ON crm.companies USING btree (workspace_id, lower(name));
CREATE INDEX companies_owner ON crm.companies USING btree (workspace_id, owner_id);
CREATE INDEX companies_search_trigram ON crm.companies
  USING gin (crm.company_search_text(name, domain, phone) gin_trgm_ops);
CREATE INDEX companies_search_words ON crm.companies
  USING gin (to_tsvector('simple'::regconfig, crm.company_search_text(name, domain, phone)));
CREATE INDEX companies_updated_at ON crm.companies USING btree (workspace_id, updated_at, id);

create table crm.deals (
  workspace_id uuid default crm.current_workspace_id() not null,
  id uuid default crm.uuid_v7() not null,
  owner_id uuid default crm.current_user_id() not null,
  name text not null,
  amount numeric(18,2),
  currency text default 'USD'::text not null,
  stage text not null,
  stage_changed_at timestamp with time zone default now() not null,
  close_date date,
  company_id uuid,
  custom_fields jsonb default '{}'::jsonb not null,
  created_at timestamp with time zone default now() not null,
  updated_at timestamp with time zone default now() not null,
  created_by uuid default crm.current_user_id(),
  updated_by uuid default crm.current_user_id(),
  constraint deals_pkey PRIMARY KEY (workspace_id, id),
  constraint deals_amount_check CHECK ((amount >= (0)::numeric)),
  constraint deals_currency_format CHECK ((currency ~ '^[A-Z]{3}$'::text)),
  constraint deals_custom_fields_check CHECK (crm.custom_fields_are_valid(custom_fields)),
  constraint deals_name_length CHECK (((length(name) >= 1) AND (length(name) <= 255)))
);
alter table crm.deals enable row level security;
alter table crm.deals force row level security;
CREATE INDEX deals_amount ON crm.deals USING btree (workspace_id, amount, id);
CREATE INDEX deals_company ON crm.deals USING btree (workspace_id, company_id);
CREATE INDEX deals_created_at ON crm.deals USING btree (workspace_id, created_at, id);
CREATE INDEX deals_custom_fields ON crm.deals USING gin (custom_fields jsonb_path_ops);
CREATE INDEX deals_owner ON crm.deals USING btree (workspace_id, owner_id);
CREATE INDEX deals_search_trigram ON crm.deals USING gin (crm.deal_search_text(name) gin_trgm_ops);
CREATE INDEX deals_search_words ON crm.deals USING gin (to_tsvector('simple'::regconfig, crm.deal_search_text(name)));
CREATE INDEX deals_stage ON crm.deals USING btree (workspace_id, stage, created_at, id);
CREATE INDEX deals_updated_at ON crm.deals USING btree (workspace_id, updated_at, id);

create table crm.deal_stages (
  workspace_id uuid not null,
  key text not null,
  label text not null,
  "position" integer not null,
  is_closed boolean default false not null,
  is_won boolean default false not null,
  constraint deal_stages_pkey PRIMARY KEY (workspace_id, key),
  constraint deal_stages_position_unique UNIQUE (workspace_id, "position") DEFERRABLE INITIALLY DEFERRED,
  constraint deal_stages_key_format CHECK ((key ~ '^[a-z][a-z0-9_]{0,62}$'::text)),
  constraint deal_stages_label_length CHECK (((length(label) >= 1) AND (length(label) <= 100))),
  constraint deal_stages_position_check CHECK (("position" >= 0)),
  constraint deal_stages_won_is_closed CHECK (((NOT is_won) OR is_closed))
);
alter table crm.deal_stages enable row level security;
alter table crm.deal_stages force row level security;

create table crm.associations (
  workspace_id uuid default crm.current_workspace_id() not null,
  id uuid default crm.uuid_v7() not null,
  contact_id uuid,
  company_id uuid,
  deal_id uuid,
  created_at timestamp with time zone default now() not null,
  created_by uuid default crm.current_user_id(),
  constraint associations_pkey PRIMARY KEY (workspace_id, id),
  constraint associations_links_two CHECK ((num_nonnulls(contact_id, company_id, deal_id) = 2))
);
alter table crm.associations enable row level security;
alter table crm.associations force row level security;
CREATE INDEX associations_company ON crm.associations USING btree (workspace_id, company_id, contact_id);
CREATE UNIQUE INDEX associations_company_deal ON crm.associations
  USING btree (workspace_id, company_id, deal_id)
  WHERE (contact_id IS NULL);
CREATE INDEX associations_contact ON crm.associations USING btree (workspace_id, contact_id);
CREATE UNIQUE INDEX associations_contact_company ON crm.associations
  USING btree (workspace_id, contact_id, company_id)
  WHERE (deal_id IS NULL);
CREATE UNIQUE INDEX associations_contact_deal ON crm.associations
  USING btree (workspace_id, contact_id, deal_id)
  WHERE (company_id IS NULL);
CREATE INDEX associations_deal ON crm.associations USING btree (workspace_id, deal_id, contact_id, company_id);

create table crm.idempotency_keys (
  workspace_id uuid default crm.current_workspace_id() not null,
  user_id uuid default crm.current_user_id() not null,
  key text not null,
  request_hash text not null,
  response_status integer,
  response_body text,
  response_headers jsonb default '{}'::jsonb not null,
  created_at timestamp with time zone default now() not null,
  expires_at timestamp with time zone default (now() + '24:00:00'::interval) not null,
  constraint idempotency_keys_pkey PRIMARY KEY (workspace_id, user_id, key),
  constraint idempotency_keys_key_length CHECK (((length(key) >= 1) AND (length(key) <= 255)))
);
alter table crm.idempotency_keys enable row level security;
alter table crm.idempotency_keys force row level security;
CREATE INDEX idempotency_keys_expires_at ON crm.idempotency_keys USING btree (expires_at);

-- Foreign keys

alter table crm.associations
  add constraint associations_company_fkey FOREIGN KEY (workspace_id, company_id)
  REFERENCES crm.companies(workspace_id, id) ON DELETE CASCADE;
alter table crm.associations
  add constraint associations_contact_fkey FOREIGN KEY (workspace_id, contact_id)
  REFERENCES crm.contacts(workspace_id, id) ON DELETE CASCADE;
alter table crm.associations
  add constraint associations_deal_fkey FOREIGN KEY (workspace_id, deal_id)
  REFERENCES crm.deals(workspace_id, id) ON DELETE CASCADE;
alter table crm.associations
  add constraint associations_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.companies
  add constraint companies_owner_fkey FOREIGN KEY (workspace_id, owner_id)
  REFERENCES crm.memberships(workspace_id, user_id);
alter table crm.contacts
  add constraint contacts_company_fkey FOREIGN KEY (workspace_id, company_id)
  REFERENCES crm.companies(workspace_id, id) ON DELETE SET NULL (company_id);
alter table crm.contacts
  add constraint contacts_owner_fkey FOREIGN KEY (workspace_id, owner_id)
  REFERENCES crm.memberships(workspace_id, user_id);
alter table crm.deal_stages
  add constraint deal_stages_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.deals
  add constraint deals_company_fkey FOREIGN KEY (workspace_id, company_id)
  REFERENCES crm.companies(workspace_id, id) ON DELETE SET NULL (company_id);
alter table crm.deals
  add constraint deals_owner_fkey FOREIGN KEY (workspace_id, owner_id)
  REFERENCES crm.memberships(workspace_id, user_id);
alter table crm.deals
  add constraint deals_stage_fkey FOREIGN KEY (workspace_id, stage)
  REFERENCES crm.deal_stages(workspace_id, key) ON UPDATE CASCADE;
alter table crm.idempotency_keys
  add constraint idempotency_keys_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
