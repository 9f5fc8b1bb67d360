// Hot SQL is inlinable or PL/pgSQL (sql/CONVENTIONS.md): PostgreSQL before 18 plans the body of a SQL
// function that is not inlined on every call. This lists every SQL function on the request path
// that cannot be inlined (SECURITY DEFINER, a SET clause, or set-returning and strict or volatile: a
// set-returning function otherwise is inlined where it is called in FROM, as its callers do): reached from
// a policy, a column default or a trigger of a crm table, or callable by crm_api, and through the
// SQL and PL/pgSQL bodies that these call. (A volatile SQL function is inlined all the same.)
import t from 'tap'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'

const url = await createTestDatabase(t)

export type HotSqlViolator = { name: string; why: string; reached_from: string }

// Called once by a request of a rare route (sign-in, two-factor, OAuth, invitations, the webhook
// limits, the rate limit's rollback count) or of an import batch: known, left for later, and no new
// one may join them.
const KNOWN = [
  'crm.count_request(uuid)',
  'crm.disable_totp()',
  'crm.import_proof(uuid)',
  'crm.invitation_preview(bytea)',
  'crm.issue_token(uuid,text,text,bytea,interval)',
  'crm.my_totp()',
  'crm.non_member_ids(uuid[])',
  'crm.oauth_authorization_client(text,text)',
  'crm.oauth_client(text,bytea)',
  'crm.oauth_client_redirect_ok(text,text)',
  'crm.oauth_grant_user_active(uuid,uuid)',
  'crm.release_attempt(text,text,uuid)',
  'crm.webhook_attempt_next_state(timestamp with time zone,text,integer,text,interval[])',
  'crm.webhooks_enabled(uuid)',
]

t.test('no SQL function on the request path is left to be planned per call', async (t) => {
  const client = await ownerClient(t, url)
  const { rows: functions } = await client.query<{
    oid: number
    name: string
    proname: string
    language: string
    prosecdef: boolean
    proconfig: string[] | null
    proretset: boolean
    proisstrict: boolean
    provolatile: string
    prosrc: string
    calls: number[]
    for_api: boolean
  }>(`
    select p.oid::int, p.oid::regprocedure::text as name, p.proname, l.lanname as language, p.prosecdef, p.proconfig,
           p.proretset, p.proisstrict, p.provolatile, coalesce(p.prosrc, '') as prosrc,
           array(select d.refobjid::int from pg_depend d
                  where d.classid = 'pg_proc'::regclass and d.objid = p.oid and d.refclassid = 'pg_proc'::regclass) as calls,
           has_function_privilege('crm_api', p.oid, 'execute') or has_function_privilege('crm_runtime', p.oid, 'execute') as for_api
      from pg_proc p join pg_language l on l.oid = p.prolang
     where p.pronamespace = 'crm'::regnamespace`)
  const { rows: roots } = await client.query<{ oid: number; place: string }>(`
    select d.refobjid::int as oid, format('policy %s on %s', po.polname, po.polrelid::regclass) as place
      from pg_depend d join pg_policy po on d.classid = 'pg_policy'::regclass and d.objid = po.oid
     where d.refclassid = 'pg_proc'::regclass and po.polroles <> array['crm_owner'::regrole::oid]
    union all
    select d.refobjid::int, format('default of %s.%s', ad.adrelid::regclass, a.attname)
      from pg_depend d join pg_attrdef ad on d.classid = 'pg_attrdef'::regclass and d.objid = ad.oid
      join pg_attribute a on a.attrelid = ad.adrelid and a.attnum = ad.adnum
     where d.refclassid = 'pg_proc'::regclass and ad.adrelid::regclass::text like 'crm.%'
    union all
    select tg.tgfoid::int, format('trigger %s on %s', tg.tgname, tg.tgrelid::regclass)
      from pg_trigger tg where not tg.tgisinternal and tg.tgrelid::regclass::text like 'crm.%'`)
  const byOid = new Map(functions.map((f) => [f.oid, f]))
  const byName = new Map<string, number[]>()
  for (const f of functions) byName.set(f.proname, [...(byName.get(f.proname) ?? []), f.oid])
  const callees = (f: (typeof functions)[number]) => {
    const named = [...f.prosrc.matchAll(/crm\.([a-z_0-9]+)\s*\(/g)].flatMap((match) => byName.get(match[1]) ?? [])
    return [...new Set([...f.calls, ...named])].filter((oid) => byOid.has(oid) && oid !== f.oid)
  }
  const reachedFrom = new Map<number, string>()
  const queue: [number, string][] = [
    ...roots.map((root) => [root.oid, root.place] as [number, string]),
    ...functions.filter((f) => f.for_api).map((f) => [f.oid, 'called by crm_api'] as [number, string]),
  ]
  while (queue.length > 0) {
    const [oid, place] = queue.shift()!
    const f = byOid.get(oid)
    if (!f || reachedFrom.has(oid)) continue
    reachedFrom.set(oid, place)
    for (const next of callees(f)) queue.push([next, place])
  }
  const violators: HotSqlViolator[] = []
  for (const [oid, place] of reachedFrom) {
    const f = byOid.get(oid)!
    if (f.language !== 'sql') continue
    const inlinedInFrom = !f.proisstrict && f.provolatile !== 'v'
    const why = [
      f.prosecdef && 'SECURITY DEFINER',
      f.proconfig && `SET ${f.proconfig.join(', ')}`,
      f.proretset && !inlinedInFrom && 'set-returning',
    ].filter(Boolean)
    if (why.length > 0) violators.push({ name: f.name, why: why.join('; '), reached_from: place })
  }
  violators.sort((a, b) => a.name.localeCompare(b.name))
  if (violators.length > 0) t.comment(`hot SQL that PostgreSQL before 18 plans on every call:\n${JSON.stringify(violators, null, 2)}`)
  t.same(
    violators.filter((v) => !KNOWN.includes(v.name)),
    [],
    'every SQL function on the request path is inlinable (or the function is PL/pgSQL), but the known ones',
  )
})
