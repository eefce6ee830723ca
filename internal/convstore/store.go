// Package convstore holds the conversation engine's state
// (internal/conversation) for one service replica: in memory, where every
// decision is made (Memory, the source of truth for the agents the replica
// owns), and in a Journal of small per-context and per-task records that
// makes it durable and rebuilds it on recovery (BoltJournal for one
// replica, RedisJournal for several, fenced by agent ownership).
//
// A decision never reads the journal: the hot path is a map look-up, the
// pure engine, the encoding of the one or two records it changed, and a
// group commit shared with every concurrent decision.
package convstore

import "errors"

// Errors returned by the state layer.
var (
	// ErrNotOwner: the replica does not own the agent (another replica
	// decides for it, or its ownership was fenced off).
	ErrNotOwner = errors.New("agent not owned by this replica")
	// ErrClosed: the journal was closed.
	ErrClosed = errors.New("journal closed")
)
