// Constraint names of sql/000003_records.sql → the JSON pointer of the field each protects, so a
// duplicate email answers 409 with pointer /email and a bad domain 422 with /domain.
import { registerConstraintFields } from '../http/database-errors.ts'

const FIELDS: Record<string, string> = {
  companies_name_length: '/name',
  companies_domain_format: '/domain',
  companies_domain_unique: '/domain',
  companies_website_format: '/website',
  companies_industry_length: '/industry',
  companies_phone_format: '/phone',
  companies_city_length: '/city',
  companies_country_length: '/country',
  companies_employee_count_check: '/employee_count',
  companies_annual_revenue_check: '/annual_revenue',
  companies_description_length: '/description',
  companies_custom_fields_check: '/custom_fields',
  companies_owner_fkey: '/owner_id',
  contacts_first_name_length: '/first_name',
  contacts_last_name_length: '/last_name',
  contacts_email_format: '/email',
  contacts_email_unique: '/email',
  contacts_phone_format: '/phone',
  contacts_job_title_length: '/job_title',
  contacts_city_length: '/city',
  contacts_country_length: '/country',
  contacts_custom_fields_check: '/custom_fields',
  contacts_name_or_email: '/first_name',
  contacts_owner_fkey: '/owner_id',
  contacts_company_fkey: '/company_id',
  deals_name_length: '/name',
  deals_amount_check: '/amount',
  deals_currency_format: '/currency',
  deals_custom_fields_check: '/custom_fields',
  deals_owner_fkey: '/owner_id',
  deals_stage_fkey: '/stage',
  deals_company_fkey: '/company_id',
  idempotency_keys_key_length: '/idempotency_key',
}

registerConstraintFields(FIELDS)

export const RECORD_CONSTRAINT_FIELDS = FIELDS
