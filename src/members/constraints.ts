// Constraint names of sql/migrations/000002_tenancy_and_access.sql → the field each protects,
// so a taken email, role or team name answers 409 with its pointer (composed with the other areas'
// lists in src/db/database-errors.ts).
export const MEMBER_CONSTRAINT_FIELDS: Readonly<Record<string, string>> = Object.freeze({
  users_email_key: '/email',
  users_email_format: '/email',
  users_name_length: '/name',
  workspaces_name_length: '/workspace_name',
  roles_name_key: '/name',
  roles_name_format: '/name',
  teams_name_key: '/name',
  teams_name_length: '/name',
  invitations_email_format: '/email',
})
