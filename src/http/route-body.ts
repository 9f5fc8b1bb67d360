// A route's body, received before its database work, so a slow client never holds a connection:
// whole, under its limit and deadlines (body.ts), while a receipt bounds the bodies being received
// per address and per process. A JSON body of an authenticated route is read at once for a token
// the process has proven before; any other token is authenticated first, in a short transaction of
// its own, so a made-up token's body is refused (401) without a byte of it read. A file body
// (an upload) is received only for a caller already proven who holds the workspace's slot.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { TSchema } from 'typebox'
import type { Caller } from '../auth/caller.ts'
import type { Config } from '../config.ts'
import type { DatabaseRequest, RequestDatabase } from '../db/request/request-database.ts'
import { JSON_BODY_LIMIT, readJsonObject } from './body.ts'
import { type RouteDefinition, routeCallerCheck, type Services, validateBody } from './route.ts'
import { type ReceivedUpload, receiveUpload } from './upload-receipts.ts'
import type { WorkspaceSlots } from './workspace-slots.ts'

export type ReceivedBody = { body: unknown; upload?: ReceivedUpload }

export function createRouteBodies(options: {
  config: Pick<Config, 'bodyIdleTimeoutMs'>
  services: Pick<Services, 'bodyReceipts' | 'callerBodyReceipts' | 'uploadReceipts'>
  database: RequestDatabase<Caller>
  workspaceSlots: WorkspaceSlots
  /**
   * Whether the process has proven the request's credential before (its identity is cached): a
   * hint, which the request's own authentication proves again. Without it, every credential is
   * unknown, and its body is read only after a short authenticating transaction.
   */
  knownCredential?: (req: IncomingMessage) => boolean
}): { receive: (definition: RouteDefinition, req: DatabaseRequest, res: ServerResponse) => Promise<ReceivedBody> } {
  const { config, services, database, workspaceSlots } = options

  async function receiveJson(definition: RouteDefinition, schema: TSchema, req: DatabaseRequest, res: ServerResponse): Promise<unknown> {
    // A known token's body is read at once: its request stays one transaction (or one statement).
    const byCaller = definition.auth === 'required'
    if (byCaller && !options.knownCredential?.(req)) await database.authenticateFirst(req, routeCallerCheck(definition, res))
    // Held while the body arrives: slow senders are bounded per address and in all.
    const releaseReceipt = (byCaller ? services.callerBodyReceipts : services.bodyReceipts).take(req)
    try {
      const body = await readJsonObject(req, config.bodyIdleTimeoutMs)
      definition.checkBodyBeforeSchema?.(body)
      return validateBody(schema, body)
    } finally {
      releaseReceipt()
    }
  }

  /**
   * First a receipt (per address and per process, upload-receipts.ts), so one address cannot make
   * the database authenticate more uploads at once than its bound; then a short transaction of its
   * own authenticates, checks the route's grant and takes the slot; only then is the body written
   * to a temporary file, under the process's cap on such files, with no connection held while it
   * arrives. An unknown, expired or revoked token gets its 401 with nothing received. The
   * handler's transaction authenticates again, so a token revoked during a long upload is refused
   * then, without counting the request a second time. The slot and the receipt are held until the
   * answer.
   */
  function receiveRouteUpload(definition: RouteDefinition, req: DatabaseRequest, res: ServerResponse): Promise<ReceivedUpload> {
    return receiveUpload(
      services.uploadReceipts,
      req,
      { limit: definition.fileLimit ?? JSON_BODY_LIMIT, idleTimeoutMs: config.bodyIdleTimeoutMs },
      async (hold) => {
        if (definition.auth !== 'required') return
        await database.authenticateFirst(req, routeCallerCheck(definition, res), async (db, caller) => {
          await definition.checkCallerBeforeBody?.(db)
          if (definition.limitedPerWorkspace) hold(workspaceSlots.take(definition.limitedPerWorkspace, caller.workspaceId))
        })
      },
    )
  }

  return {
    receive: async (definition, req, res) => {
      if (definition.bodyKind === 'file') return { body: undefined, upload: await receiveRouteUpload(definition, req, res) }
      return { body: definition.body ? await receiveJson(definition, definition.body, req, res) : undefined }
    },
  }
}
