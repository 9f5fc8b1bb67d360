// Operator commands (workspaces, users, members, roles) come with the tenancy schema.
import type { Command } from './main.ts'

export const commands: Record<string, Command> = {}
