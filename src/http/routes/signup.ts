// POST /api/signup: a new user with a new workspace (docs/api.md section 3).
import Type from 'typebox'
import { signUp } from '../../members/signup.ts'
import { defineRoutes } from '../route.ts'
import { TokenBodySchema } from './auth.ts'

/** The same shape crm.users accepts (users_email_format), so the body check and the table agree. */
// The domain splits at its first dot after the first character: the same strings as
// [^@\\s]+\\.[^@\\s]+ with a single way to match (that form backtracks quadratically).
export const EmailSchema = Type.String({
  pattern: '^\\s*[^@\\s]+@[^@\\s][^@\\s.]*\\.[^@\\s]+\\s*$',
  maxLength: 254,
  description: 'stored lower-case',
})
export const PasswordSchema = Type.String({ minLength: 10, maxLength: 1024, description: 'at least 10 characters, not the email' })
export const PersonNameSchema = Type.String({ minLength: 1, maxLength: 255, pattern: '\\S' })

const SignUpBody = Type.Object(
  {
    email: EmailSchema,
    password: PasswordSchema,
    name: PersonNameSchema,
    workspace_name: Type.String({ minLength: 1, maxLength: 255, pattern: '\\S' }),
  },
  { additionalProperties: false },
)

export default defineRoutes({
  method: 'POST',
  path: '/api/signup',
  summary: 'Create a user and a new workspace whose admin they are (trial starts now); answers with a bearer token',
  tag: 'workspace administration',
  auth: 'none',
  credentials: 'anonymous',
  limitedPerAddress: true,
  body: SignUpBody,
  status: 201,
  response: TokenBodySchema,
  errors: [400, 409, 413, 415, 422],
  example: { request: { email: 'ada@example.com', password: 'correct horse battery', name: 'Ada Lovelace', workspace_name: 'Acme' } },
  handler: async ({ services, body }) => {
    const { workspace_slug: _slug, ...token } = await signUp(services.pool, services.config, body)
    return { status: 201, body: token }
  },
})
