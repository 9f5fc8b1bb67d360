// Search: what matches, and how well. Candidates come from the trigram and full-text indexes on
// crm.<type>_search_text(...) (substring, fuzzy word similarity, word prefixes, phone digits); the
// score ranks exact matches (3 + similarity) above word-prefix matches (2 + ...) above the rest
// (1 + ...), so "ann" finds Ann before Joanna, and a typo still finds something.
import Type from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import type { RecordType } from './fields.ts'
import { escapeLike, type SearchPart } from './list-query.ts'

type Fragment = ReturnType<typeof sql.fragment>

/** The indexed expression of each type: must be the very call the indexes in 000003 were built on. */
export function searchDocument(type: RecordType): Fragment {
  switch (type.name) {
    case 'contact':
      return sql.fragment`crm.contact_search_text(t.first_name, t.last_name, t.email, t.phone)`
    case 'company':
      return sql.fragment`crm.company_search_text(t.name, t.domain, t.phone)`
    case 'deal':
      return sql.fragment`crm.deal_search_text(t.name)`
  }
}

function exactMatch(type: RecordType, text: string, digits: string | null): Fragment {
  const phone = digits ? sql.fragment` or crm.digits(t.phone) = ${digits}` : sql.fragment``
  switch (type.name) {
    case 'contact':
      return sql.fragment`(lower(t.first_name) = ${text} or lower(t.last_name) = ${text}
        or lower(coalesce(t.first_name, '') || ' ' || coalesce(t.last_name, '')) = ${text} or t.email = ${text}${phone})`
    case 'company':
      return sql.fragment`(lower(t.name) = ${text} or t.domain = ${text}${phone})`
    case 'deal':
      return sql.fragment`(lower(t.name) = ${text})`
  }
}

/** Digits of a query that looks like a phone number (at least 3 digits, only phone punctuation). */
export function phoneDigits(q: string): string | null {
  if (!/^[0-9 +().\-/]+$/.test(q)) return null
  const digits = q.replace(/\D/g, '')
  return digits.length >= 3 ? digits : null
}

/** Words for a prefix full-text query: letters and digits only, so to_tsquery never sees syntax. */
export function prefixQuery(q: string): string | null {
  const words = (q.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? []).slice(0, 8).map((word) => word.slice(0, 60))
  return words.length > 0 ? words.map((word) => `${word}:*`).join(' & ') : null
}

export function searchPart(type: RecordType, q: string): SearchPart {
  const text = q.toLowerCase()
  const digits = phoneDigits(q)
  const document = searchDocument(type)
  const words = prefixQuery(q)
  const candidates: Fragment[] = [sql.fragment`${document} like ${`%${escapeLike(text)}%`}`, sql.fragment`${text}::text <% ${document}`]
  if (words) candidates.push(sql.fragment`to_tsvector('simple'::regconfig, ${document}) @@ to_tsquery('simple'::regconfig, ${words})`)
  if (digits) candidates.push(sql.fragment`${document} like ${`%${digits}%`}`)
  const prefix: Fragment[] = [sql.fragment`(' ' || ${document}) like ${`% ${escapeLike(text)}%`}`]
  if (digits) prefix.push(sql.fragment`(' ' || ${document}) like ${`% ${digits}%`}`)
  const score = sql.fragment`((case when ${exactMatch(type, text, digits)} then 3
                                    when ${sql.join(prefix, sql.fragment` or `)} then 2
                                    else 1 end) + word_similarity(${text}::text, ${document}))::float8`
  return { where: sql.fragment`(${sql.join(candidates, sql.fragment` or `)})`, score }
}

export type SearchHit = { type: RecordType; record: Record<string, unknown>; score: number }

/** A record as crm.<type>_json renders it, and its score (float8, which pg reads as a number). */
const SearchRow = rowType(Type.Object({ record: Type.Record(Type.String(), Type.Unknown()), score: Type.Number() }))

/** The best `limit` matches of one type, best first (global search merges several of these). */
export async function searchType(db: DatabaseTransactionConnection, type: RecordType, q: string, limit: number): Promise<SearchHit[]> {
  const part = searchPart(type, q)
  const rows = await db.any(sql.type(SearchRow)`
    select ${type.jsonFunction}(t) as record, ${part.score} as score
      from ${type.table} as t
     where ${part.where}
     order by 2 desc, t.id
     limit ${limit}`)
  return rows.map((row) => ({ type, record: row.record, score: row.score }))
}

/** The one-line title and subtitle a search result shows. */
export function describe(type: RecordType, record: Record<string, any>): { title: string; subtitle: string | null } {
  switch (type.name) {
    case 'contact': {
      const name = [record.first_name, record.last_name].filter(Boolean).join(' ')
      return name
        ? { title: name, subtitle: record.email ?? record.job_title ?? null }
        : { title: record.email, subtitle: record.job_title ?? null }
    }
    case 'company':
      return { title: record.name, subtitle: record.domain ?? record.industry ?? null }
    case 'deal':
      return {
        title: record.name,
        subtitle: record.amount === null ? record.stage : `${record.stage} · ${record.amount} ${record.currency}`,
      }
  }
}
