// `crm listen --forward-to <url>` (docs/api.md section 8a): follows a workspace's events feed with
// long polling and forwards each event to a local URL as a webhook delivery would arrive, signed
// with both schemes of section 8 by the service's own signing code, with a local secret it prints.
// A developer tests a receiver without exposing it. The cursor and the secret are kept in a small
// file (--state, default .crm-listen/<workspace>.json in the current directory), so a restart
// resumes after the last page forwarded and the receiver keeps its secret.
import { randomUUID } from 'node:crypto'
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { parseCidrList } from '../cidr.ts'
import { asciiJson } from '../webhooks/ascii-json.ts'
import { newWebhookSecret } from '../webhooks/signature.ts'
import { type CliContext, CliError, type Command } from './command.ts'

/** The forwarding target is the developer's own choice on their own machine: any address, http too. */
const LOCAL_POLICY = { allowHttp: true, allowedCidrs: parseCidrList('0.0.0.0/0,::/0') }
const WAIT_SECONDS = 25
const MAX_PAUSE_MS = 30_000

type ListenState = { secret: string; listener_id: string; cursor: string | null }

type FeedEvent = { id: string; event: string; occurred_at: string; workspace: unknown; data: unknown; actor: unknown }

function readState(path: string): ListenState {
  try {
    const state = JSON.parse(readFileSync(path, 'utf8')) as Partial<ListenState>
    if (typeof state.secret === 'string' && typeof state.listener_id === 'string') {
      return { secret: state.secret, listener_id: state.listener_id, cursor: typeof state.cursor === 'string' ? state.cursor : null }
    }
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw new Error(`cannot read ${path}: ${(error as Error).message}`)
  }
  return { secret: newWebhookSecret(), listener_id: randomUUID(), cursor: null }
}

/** Written to a temporary file and renamed, so a crash leaves the old state or the new one. */
function writeState(path: string, state: ListenState): void {
  mkdirSync(dirname(path), { recursive: true })
  writeFileSync(`${path}.tmp`, JSON.stringify(state) + '\n', { mode: 0o600 })
  renameSync(`${path}.tmp`, path)
}

/** The body a webhook delivery of the event carries: the feed's envelope plus delivered_at and delivery_id. */
function deliveryBody(event: FeedEvent, deliveryId: string): string {
  const { id, event: name, occurred_at, workspace, data, actor } = event
  return asciiJson({
    id,
    event: name,
    occurred_at,
    delivered_at: new Date().toISOString(),
    delivery_id: deliveryId,
    workspace,
    data,
    actor,
  })
}

class ListenStopped extends Error {}

async function listen(context: CliContext, values: Record<string, unknown>): Promise<number> {
  const forwardTo = values['forward-to'] as string | undefined
  const workspace = values.workspace as string | undefined
  const token = (values.token as string | undefined) ?? process.env.CRM_TOKEN
  if (!forwardTo || !workspace || !token)
    throw new CliError('invalid_arguments', 'missing --forward-to, --workspace or --token (or CRM_TOKEN)')
  if (!/^https?:\/\//.test(forwardTo)) throw new CliError('invalid_arguments', '--forward-to must be an http:// or https:// URL')
  const apiUrl = ((values['api-url'] as string | undefined) ?? `http://localhost:${process.env.PORT || 3000}`).replace(/\/+$/, '')
  const statePath = (values.state as string | undefined) ?? join('.crm-listen', `${workspace}.json`)
  const types = values.types as string | undefined
  const state = readState(statePath)
  writeState(statePath, state)

  const stop = new AbortController()
  const onSignal = () => stop.abort(new ListenStopped('stopped'))
  process.once('SIGINT', onSignal)
  process.once('SIGTERM', onSignal)
  context.print(
    `Ready: forwarding the events of ${workspace} from ${apiUrl} to ${forwardTo}\nSigning secret: ${state.secret}\nCursor kept in ${statePath}${state.cursor ? ' (resuming)' : ''}`,
    { ready: true, workspace, forward_to: forwardTo, secret: state.secret, state_file: statePath, resuming: state.cursor !== null },
  )

  let pauseMs = 500
  try {
    while (!stop.signal.aborted) {
      const query = new URLSearchParams({ wait: String(WAIT_SECONDS), limit: '100' })
      if (state.cursor) query.set('after', state.cursor)
      if (types) query.set('types', types)
      let response: Response
      try {
        response = await fetch(`${apiUrl}/api/events?${query}`, {
          headers: { authorization: `Bearer ${token}`, 'x-tenant-slug': workspace },
          signal: stop.signal,
        })
      } catch (error) {
        if (stop.signal.aborted) break
        console.error(`crm listen: ${apiUrl} did not answer (${(error as Error).message}); retrying in ${pauseMs} ms`)
        await pause(pauseMs, stop.signal)
        pauseMs = Math.min(pauseMs * 2, MAX_PAUSE_MS)
        continue
      }
      const text = await response.text()
      if (response.status === 410) {
        throw new CliError(
          'cursor_expired',
          `the kept cursor has expired (410 cursor_expired): remove ${statePath} to start again from the oldest event kept`,
        )
      }
      if (response.status === 429 || response.status >= 500) {
        const retryAfter = Number(response.headers.get('retry-after')) * 1000 || pauseMs
        console.error(`crm listen: the API answered ${response.status}; retrying in ${retryAfter} ms`)
        await pause(retryAfter, stop.signal)
        pauseMs = Math.min(pauseMs * 2, MAX_PAUSE_MS)
        continue
      }
      if (response.status !== 200) throw new Error(`the API answered ${response.status}: ${text.slice(0, 300)}`)
      pauseMs = 500
      const page = JSON.parse(text) as { data: FeedEvent[]; next_cursor: string }
      for (const event of page.data) await forward(context, forwardTo, state, event)
      state.cursor = page.next_cursor
      writeState(statePath, state)
    }
  } catch (error) {
    if (!(error instanceof ListenStopped) && !stop.signal.aborted) throw error
  } finally {
    process.off('SIGINT', onSignal)
    process.off('SIGTERM', onSignal)
  }
  return 0
}

/** One event to the local URL, signed like a delivery (its id is the delivery id: stable across restarts); one line printed. */
async function forward(context: CliContext, url: string, state: ListenState, event: FeedEvent): Promise<void> {
  // Imported here, not at the top: they load undici and TypeBox, which every other `crm` command
  // would otherwise pay for at start (Node caches them after the first event).
  const [{ sendSignedWebhook }, { deliveryHeaders }] = await Promise.all([
    import('../webhooks/send.ts'),
    import('../webhooks/request-headers.ts'),
  ])
  const attempt = await sendSignedWebhook({
    url,
    policy: LOCAL_POLICY,
    id: event.id,
    secrets: [state.secret],
    body: deliveryBody(event, event.id),
    headers: deliveryHeaders({ event: event.event, deliveryId: event.id, subscriptionId: state.listener_id }),
  })
  const outcome = attempt.status === null ? (attempt.error ?? 'failed') : String(attempt.status)
  context.print(`${event.occurred_at}  ${event.event.padEnd(16)} ${event.id}  -> ${outcome} (${attempt.durationMs} ms)`, {
    id: event.id,
    event: event.event,
    occurred_at: event.occurred_at,
    status: attempt.status,
    error: attempt.error,
    duration_ms: attempt.durationMs,
  })
}

function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms)
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(timer)
        resolve()
      },
      { once: true },
    )
  })
}

export const commands: Record<string, Command> = {
  listen: {
    usage: 'listen --forward-to URL --workspace S [--token T] [--api-url U] [--types deal.*,...] [--state FILE]',
    summary: "forward a workspace's events to a local URL, signed with a local secret it prints; resumes after a restart",
    options: {
      'forward-to': { type: 'string' },
      workspace: { type: 'string' },
      token: { type: 'string' },
      'api-url': { type: 'string' },
      types: { type: 'string' },
      state: { type: 'string' },
    },
    run: listen,
  },
}
