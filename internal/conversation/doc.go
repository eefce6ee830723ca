// Package conversation is the rules engine of the conversation service: given
// the stored state of an agent's conversation contexts and one incoming
// event (a request from a requester, or a reply event from the agent), it
// decides what happens and returns the new state. It is pure: no I/O, no
// goroutines, no clock of its own (every call takes now), no randomness.
//
// The rules come from the A2A over MQTT profile's multi-turn user story
// (Task.context_id continuity, input-required resume with fresh correlation,
// -32602 on context mismatch, unknown context = new context, expired
// context = error, concurrent tasks complete independently), from the
// ConversationPolicy limits, and from what a responder declared in the
// continuation hint of a pause (seed 004: resume_scope, expected_input;
// refused with -32063 continuation_mismatch). docs/conversation.md has the
// full rules table.
//
// Two layers:
//
//   - Decide, Observe and Expire work on one Context at a time plus a View
//     of the few agent-wide facts a decision needs (which context holds the
//     task, how many contexts are live).
//   - Agent keeps all contexts of one agent in memory (maps keyed by context
//     id and task id, a deadline heap for expiry) and applies the same
//     functions in O(1) per decision. It is what the conversation service
//     decides with (internal/convstore.Memory); its OnChange hook reports
//     every change so the store can journal it as small records.
//
// Callers must treat every *Context passed in or returned as immutable: the
// engine copies a context before changing it (copy-on-write), so a stored
// value can be shared with a decision without locking.
package conversation
