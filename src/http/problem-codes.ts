// Every code a problem answer carries (docs/api.md section 2), with what it means and what the
// caller does about it: the one table GET /problems/<code> renders, so each `type` URI of a problem
// body resolves to a page. test/http/problem-pages.test.ts fails when a code the service emits has
// no row here.

export type ProblemCode = { status: number; means: string; todo: string }

export const PROBLEM_CODES: Record<string, ProblemCode> = {
  invalid_json: {
    status: 400,
    means: 'The body is not JSON, or nests deeper than the parser allows.',
    todo: 'Send a JSON object with Content-Type: application/json.',
  },
  invalid_parameter: {
    status: 400,
    means: 'A query parameter (filter, sort, limit, cursor) or the Idempotency-Key is malformed, unknown or repeated.',
    todo: 'Read errors[]: each names the parameter. Filter and sort fields are listed per type in the reference.',
  },
  token_missing: { status: 401, means: 'No Authorization header.', todo: 'Send Authorization: Bearer <token>.' },
  token_invalid: { status: 401, means: 'The token is not one the service issued.', todo: 'Check it was copied whole; get a new one.' },
  token_expired: {
    status: 401,
    means: 'The token is past its expiry.',
    todo: 'Get a new token (POST /api/token, or refresh an OAuth token).',
  },
  token_revoked: { status: 401, means: 'The token was revoked.', todo: 'Get a new token; find out who revoked this one.' },
  user_suspended: { status: 401, means: "The token's user is suspended in this workspace.", todo: 'Ask a workspace admin.' },
  api_access_disabled: {
    status: 401,
    means: 'The workspace has turned off API access for this kind of credential.',
    todo: 'Ask a workspace admin.',
  },
  invalid_credentials: {
    status: 401,
    means: 'The email or password is wrong.',
    todo: 'Check them; repeated failures lead to too_many_attempts.',
  },
  invalid_2fa_code: { status: 401, means: 'The two-factor code is wrong or used.', todo: 'Send a current code, or a recovery code.' },
  challenge_expired: { status: 401, means: 'The two-factor challenge is too old.', todo: 'Sign in again with email and password.' },
  plan_required: {
    status: 402,
    means: "Webhooks need the Pro plan or the workspace's trial.",
    todo: 'Upgrade the workspace; nothing is delivered meanwhile.',
  },
  forbidden: {
    status: 403,
    means: 'You can see the record but your role does not allow this action, or the route is for admins, or needs an unscoped credential.',
    todo: 'Ask a workspace admin for the permission, or use a personal token.',
  },
  insufficient_scope: {
    status: 403,
    means: "The token's scopes do not cover this route (WWW-Authenticate names the scope needed).",
    todo: 'Issue a token, or ask for an OAuth grant, with that scope.',
  },
  reauthentication_required: {
    status: 403,
    means: 'A long-lived token or turning two-factor on needs a sign-in in the last 10 minutes.',
    todo: 'Sign in again, then retry.',
  },
  not_found: {
    status: 404,
    means: 'No such record or route, or you may not see it (invisible and absent look the same).',
    todo: 'Check the id and the workspace (X-Tenant-Slug).',
  },
  workspace_not_found: {
    status: 404,
    means: 'X-Tenant-Slug names a workspace that does not exist or you are not a member of.',
    todo: 'GET /api/workspaces lists yours.',
  },
  request_timeout: {
    status: 408,
    means: 'The body stopped arriving (no byte for 10 seconds) or came too slowly; the connection was closed.',
    todo: 'Send the request again.',
  },
  duplicate: {
    status: 409,
    means: 'A unique value is taken (a contact email, a company domain, a role or team name).',
    todo: 'errors[] points at the field: find the existing record, or upsert through an import.',
  },
  idempotency_conflict: {
    status: 409,
    means: 'This Idempotency-Key was used within 24 hours for another body or route.',
    todo: 'Use a new key for a new request; the same key only to repeat the same one.',
  },
  role_in_use: { status: 409, means: 'Members still hold the role.', todo: 'Give them another role first.' },
  member_owns_records: {
    status: 409,
    means: 'The member still owns records.',
    todo: 'Remove them with ?reassign_to=<user_id> to hand the records over.',
  },
  delivery_not_finished: {
    status: 409,
    means: 'The delivery is pending or held: it will be sent anyway.',
    todo: 'Wait for it, or resume the subscription.',
  },
  import_already_started: { status: 409, means: 'The import already ran for real.', todo: 'Upload the file again to import it again.' },
  import_file_removed: { status: 409, means: "The import's file was pruned.", todo: 'Upload the file again.' },
  import_file_invalid: {
    status: 422,
    means: "An import job's file could not be read as CSV (an import's failure_code).",
    todo: 'Fix the file (UTF-8, one header row) and upload it again.',
  },
  conflict: {
    status: 409,
    means: 'The request conflicts with the current state.',
    todo: 'Read the detail, read the resource again, retry.',
  },
  precondition_failed: {
    status: 412,
    means: 'If-Match does not match the current ETag: someone changed the record since you read it.',
    todo: 'GET it again, reapply your change, send it with the new ETag.',
  },
  payload_too_large: { status: 413, means: 'The body is over its limit.', todo: 'Send less (split a batch, or a file).' },
  unsupported_media_type: {
    status: 415,
    means: 'Wrong Content-Type.',
    todo: 'application/json for JSON bodies; multipart/form-data or text/csv for uploads.',
  },
  validation_failed: {
    status: 422,
    means: 'The body fails validation.',
    todo: 'errors[] lists every failing field with its JSON pointer and a sentence; fix those.',
  },
  url_not_allowed: {
    status: 422,
    means: 'A webhook URL is refused: not https, or it resolves to an address that is not public.',
    todo: 'Use a public https endpoint.',
  },
  seat_limit_reached: { status: 422, means: "The workspace's plan has no seat left.", todo: 'Remove a member or upgrade the plan.' },
  rate_limited: {
    status: 429,
    means: 'Over the request rate, or a limit on uploads, exports, test events or recoveries.',
    todo: 'Wait Retry-After seconds and send the same request again (same Idempotency-Key).',
  },
  cursor_expired: {
    status: 410,
    means: 'The events feed cursor was issued longer ago than the feed keeps events (EVENTS_RETENTION_DAYS).',
    todo: 'Read the feed again without after; use GET /api/{type} lists to catch up on the state you missed.',
  },
  batch_too_large: {
    status: 422,
    means: 'A batch call holds more than 100 inputs or ids.',
    todo: 'Split it into calls of at most 100.',
  },
  batch_failed: {
    status: 422,
    means: 'An atomic batch had an item that failed, so nothing was written.',
    todo: 'Read results[]: the failed items carry their problems (the others 424); fix them and send the batch again.',
  },
  too_many_attempts: { status: 429, means: 'Too many failed sign-in attempts.', todo: 'Wait Retry-After seconds.' },
  internal_error: {
    status: 500,
    means: 'A bug on our side; nothing about it is in the body but request_id.',
    todo: 'Report the request_id. Retrying a create is safe with the same Idempotency-Key.',
  },
  unavailable: {
    status: 503,
    means: 'The database cannot be reached, the schema is behind, or the server is full for now.',
    todo: 'Wait Retry-After seconds and send the same request again.',
  },
}
