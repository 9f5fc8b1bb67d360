// A schema that integrators should see by name (Contact, ContactCreate, WebhookEvent...) carries
// its name in one keyword; src/http/openapi.ts moves every schema so marked, wherever a route
// uses it, into the document's components.schemas and refers to it there. A route author names a
// shape once, where it is defined, and every route that uses it (and the client's types) follows.
import type { TSchema } from 'typebox'

export const COMPONENT_NAME = 'x-component-name'

/** The schema itself, marked to be published under `name` (validation ignores the keyword). */
export function named<T extends TSchema>(name: string, schema: T): T {
  ;(schema as unknown as Record<string, unknown>)[COMPONENT_NAME] = name
  return schema
}
