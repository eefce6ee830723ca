// Package convstore persists the conversation engine's state
// (internal/conversation): one record per context with the summaries of its
// tasks, an index from task id to context id, and the deadline indexes that
// count live contexts and drive expiry.
//
// The central operation is Update: an atomic check-and-update of one
// context. It loads a consistent View (the context, the context of the
// request's task, the agent's live-context count), runs the caller's
// function (the pure engine) and commits its result only if nothing it read
// changed meanwhile; otherwise it reloads and runs the function again. So
// two service replicas can never both accept a request past a limit: the
// second one's commit conflicts, it re-decides on fresh state and refuses.
//
// Two implementations pass the same test suite: Bolt (go.etcd.io/bbolt, one
// file, survives restarts, one process) and Redis (github.com/redis/go-redis,
// several replicas, commits are Lua scripts).
package convstore

import (
	"context"
	"errors"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// Errors returned by stores.
var (
	// ErrNotFound: no such context or task.
	ErrNotFound = errors.New("not found")
	// ErrConflict: Update kept losing optimistic-concurrency races and gave
	// up (MaxAttempts). The caller may retry the whole request.
	ErrConflict = errors.New("state changed concurrently too often")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store closed")
)

// MaxAttempts bounds how often Update re-runs its function after a
// conflicting concurrent commit.
const MaxAttempts = 32

// Key names the state an Update touches: one context of one agent, and the
// task whose owning context the View must report.
type Key struct {
	Agent     string
	ContextID string
	TaskID    string
}

// Txn is one attempt of an Update: the View it read and the change the
// function asks for.
type Txn struct {
	// View is what was read; View.Context must not be modified.
	View conversation.View
	// Now is the time the View's live count refers to.
	Now time.Time

	write bool
	put   *conversation.Context
}

// Put asks to store c as the context's new state. c.ID must be the key's
// context id; its Version is set by the store.
func (t *Txn) Put(c *conversation.Context) { t.write, t.put = true, c }

// Delete asks to remove the context record.
func (t *Txn) Delete() { t.write, t.put = true, nil }

// Store is the state store the conversation service uses. Implementations
// are safe for concurrent use.
type Store interface {
	// Update loads key's View at now, calls fn and atomically commits what
	// fn asked for (nothing when it called neither Put nor Delete). fn may
	// run several times (after a conflicting commit, or because a read-only
	// first pass turned out to need a write) and must decide from the Txn
	// alone. An error from fn aborts the Update and is returned.
	Update(ctx context.Context, key Key, now time.Time, fn func(*Txn) error) error
	// Context returns the stored context (tombstones included).
	Context(ctx context.Context, agent, contextID string) (*conversation.Context, error)
	// TaskContext returns the id of the context holding a task.
	TaskContext(ctx context.Context, agent, taskID string) (string, error)
	// LiveContexts counts the agent's contexts not expired at now.
	LiveContexts(ctx context.Context, agent string, now time.Time) (int, error)
	// Contexts calls fn for every stored context of every agent (recovery).
	Contexts(ctx context.Context, fn func(agent string, c *conversation.Context) error) error
	// Due returns up to limit contexts whose NextDeadline is at or before
	// now, earliest first per agent.
	Due(ctx context.Context, now time.Time, limit int) ([]Ref, error)
	// Close releases the store.
	Close() error
}

// Ref names one context of one agent.
type Ref struct {
	Agent     string
	ContextID string
}

// Decide runs the engine on a request inside one atomic Update and returns
// the decision as committed. A request without a contextId is resolved to
// its task's context first (tasks never change context, so that read needs
// no transaction).
func Decide(ctx context.Context, s Store, agent string, p conversation.Policy, now time.Time, req conversation.Request) (conversation.Decision, error) {
	key := Key{Agent: agent, ContextID: req.ContextID, TaskID: req.TaskID}
	if key.ContextID == "" && req.TaskID != "" {
		id, err := s.TaskContext(ctx, agent, req.TaskID)
		switch {
		case err == nil:
			key.ContextID = id
		case !errors.Is(err, ErrNotFound):
			return conversation.Decision{}, err
		}
	}
	var d conversation.Decision
	err := s.Update(ctx, key, now, func(tx *Txn) error {
		d = conversation.Decide(p, now, tx.View, req)
		apply(tx, d.Changed, d.Context)
		return nil
	})
	return d, err
}

// Observe applies a reply event inside one atomic Update of the context
// holding its task. An event for an unknown task yields a zero Outcome.
func Observe(ctx context.Context, s Store, agent string, p conversation.Policy, now time.Time, ev conversation.Event) (conversation.Outcome, error) {
	id, err := s.TaskContext(ctx, agent, ev.TaskID)
	if errors.Is(err, ErrNotFound) {
		return conversation.Outcome{}, nil
	}
	if err != nil {
		return conversation.Outcome{}, err
	}
	var o conversation.Outcome
	err = s.Update(ctx, Key{Agent: agent, ContextID: id, TaskID: ev.TaskID}, now, func(tx *Txn) error {
		if tx.View.TaskContextID != id {
			// The task left this context (evicted or expired) since the
			// look-up: nothing to apply.
			o = conversation.Outcome{}
			return nil
		}
		o = conversation.Observe(p, now, tx.View.Context, ev)
		apply(tx, o.Changed, o.Context)
		return nil
	})
	return o, err
}

// Swept is one context changed by Sweep.
type Swept struct {
	Agent string
	conversation.Expiration
}

// Sweep applies conversation.Expire to up to limit contexts whose deadline
// passed (input-required timeouts, context expiry, end of tombstones).
// policy gives each agent's policy. Contexts whose Expire changed only
// their deadlines are updated but not returned.
func Sweep(ctx context.Context, s Store, policy func(agent string) conversation.Policy, now time.Time, limit int) ([]Swept, error) {
	refs, err := s.Due(ctx, now, limit)
	if err != nil {
		return nil, err
	}
	var out []Swept
	for _, r := range refs {
		p := policy(r.Agent)
		var x conversation.Expiration
		err := s.Update(ctx, Key{Agent: r.Agent, ContextID: r.ContextID}, now, func(tx *Txn) error {
			x = conversation.Expire(p, now, tx.View.Context)
			apply(tx, x.Changed, x.Context)
			return nil
		})
		if err != nil {
			return out, err
		}
		if x.Delete || x.Expired != nil || len(x.TimedOut) > 0 {
			out = append(out, Swept{Agent: r.Agent, Expiration: x})
		}
	}
	return out, nil
}

// Recover loads every stored context into one conversation.Agent per agent
// (a restarted replica's in-memory state).
func Recover(ctx context.Context, s Store) (map[string]*conversation.Agent, error) {
	agents := map[string]*conversation.Agent{}
	err := s.Contexts(ctx, func(agent string, c *conversation.Context) error {
		a := agents[agent]
		if a == nil {
			a = conversation.NewAgent()
			agents[agent] = a
		}
		return a.Load(c)
	})
	if err != nil {
		return nil, err
	}
	return agents, nil
}

func apply(tx *Txn, changed bool, c *conversation.Context) {
	if !changed {
		return
	}
	if c == nil {
		tx.Delete()
		return
	}
	tx.Put(c)
}

// change is what a commit does to the indexes, derived from the old and
// new record.
type change struct {
	added, removed []string
	// becomesLive: the context joins the live set (new, or replacing a
	// tombstone): the commit must check the agent's live set is unchanged.
	becomesLive bool
	// leavesLive: the context leaves the live set (expired or deleted).
	leavesLive bool
}

func diff(old, n *conversation.Context) change {
	var ch change
	ch.added, ch.removed = conversation.TaskDiff(old, n)
	wasLive := old != nil && old.Expired == nil
	isLive := n != nil && n.Expired == nil
	ch.becomesLive = isLive && !wasLive
	ch.leavesLive = wasLive && !isLive
	return ch
}
