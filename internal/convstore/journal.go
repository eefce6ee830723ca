package convstore

import (
	"context"
	"sync"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// Journal persists the changes of in-memory conversation state (Memory) as
// small records and rebuilds that state on recovery. Implementations group
// concurrent changes into one durable write (group commit, below).
type Journal interface {
	// Append queues changes for the next group commit, in order, and
	// returns at once; the Ticket reports when they are durable. Changes to
	// one context must be appended in the order they were made.
	Append(changes ...Change) *Ticket
	// Load calls fn for every stored context of agent ("" = every agent),
	// with its history items in order (nil when none).
	Load(ctx context.Context, agent string, fn func(agent string, c *conversation.Context, items []*Item) error) error
	// Close flushes what was appended and releases the journal.
	Close() error
}

// Change is what one engine step did to one context, as records: the
// context's header, the task records it created or changed, the task
// records it dropped, or the whole context deleted; and the history items
// it added or dropped.
type Change struct {
	Agent     string
	ContextID string
	// Header is the context's new header record; nil with Delete, and in a
	// change that only adds or drops history items.
	Header []byte
	// Put are task records to write (id → encoded task).
	Put []TaskRecord
	// Del are task ids whose records go.
	Del []string
	// Delete removes the context's header (its tasks are in Del, its
	// history items in DelContent).
	Delete bool
	// PutContent are history items to write; DelContent the sequence
	// numbers of items to remove.
	PutContent []ContentRecord
	DelContent []uint64
	// Fence, when set, makes the commit conditional on the replica still
	// owning the agent (Redis, several replicas).
	Fence *Fence
}

// TaskRecord is one encoded task.
type TaskRecord struct {
	ID   string
	Data []byte
}

// Fence names the ownership lease a commit depends on: the agent's owner key
// must still hold Token.
type Fence struct {
	Token string
}

// changeOf derives the records to write from a context's state before and
// after an engine step (nil n: deleted). The engine copies a task before it
// changes it (copy-on-write), so a task whose pointer is unchanged is
// unchanged and is not rewritten.
func changeOf(agent string, old, n *conversation.Context) Change {
	ch := Change{Agent: agent}
	if n == nil {
		ch.ContextID = old.ID
		ch.Delete = true
		if old != nil {
			for _, t := range old.Tasks {
				ch.Del = append(ch.Del, t.ID)
			}
		}
		return ch
	}
	ch.ContextID = n.ID
	ch.Header = encodeHeader(n)
	var before map[string]*conversation.Task
	if old != nil && len(old.Tasks) > 0 {
		before = make(map[string]*conversation.Task, len(old.Tasks))
		for _, t := range old.Tasks {
			before[t.ID] = t
		}
	}
	for _, t := range n.Tasks {
		if prev, ok := before[t.ID]; ok {
			delete(before, t.ID)
			if prev == t {
				continue
			}
		}
		ch.Put = append(ch.Put, TaskRecord{ID: t.ID, Data: encodeTask(t)})
	}
	for id := range before {
		ch.Del = append(ch.Del, id)
	}
	return ch
}

// Ticket reports when a group of appended changes is durable.
type Ticket struct {
	done chan struct{}
	err  error
}

func newTicket() *Ticket { return &Ticket{done: make(chan struct{})} }

// Wait blocks until the changes are durable (nil) or the commit failed. A
// nil Ticket (nothing was appended) is durable at once.
func (t *Ticket) Wait(ctx context.Context) error {
	if t == nil {
		return nil
	}
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// groupCommitter runs commits one at a time on its own goroutine. Changes
// appended while a commit (and its fsync) runs form the next group, which
// is committed as soon as the current one finishes: no timer, so a lone
// change is committed at once and concurrent ones share one transaction and
// one sync (bbolt's DB.Batch waits MaxBatchDelay first; measured worse).
type groupCommitter struct {
	commit func([]Change) error

	mu      sync.Mutex
	pending []Change
	cur     *Ticket
	closed  bool
	kick    chan struct{}
	done    chan struct{}
}

func newGroupCommitter(commit func([]Change) error) *groupCommitter {
	g := &groupCommitter{commit: commit, cur: newTicket(), kick: make(chan struct{}, 1), done: make(chan struct{})}
	go g.run()
	return g
}

func (g *groupCommitter) Append(changes ...Change) *Ticket {
	if len(changes) == 0 {
		return nil
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		t := newTicket()
		t.err = ErrClosed
		close(t.done)
		return t
	}
	g.pending = append(g.pending, changes...)
	t := g.cur
	// Under mu: close closes kick under mu too, so this never sends on a
	// closed channel.
	select {
	case g.kick <- struct{}{}:
	default:
	}
	g.mu.Unlock()
	return t
}

func (g *groupCommitter) run() {
	defer close(g.done)
	for range g.kick {
		for {
			g.mu.Lock()
			batch, t := g.pending, g.cur
			if len(batch) == 0 {
				closed := g.closed
				g.mu.Unlock()
				if closed {
					return
				}
				break
			}
			g.pending, g.cur = nil, newTicket()
			g.mu.Unlock()
			t.err = g.commit(batch)
			close(t.done)
		}
	}
}

// close commits what is pending and stops the committer.
func (g *groupCommitter) close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		<-g.done
		return
	}
	g.closed = true
	select {
	case g.kick <- struct{}{}:
	default:
	}
	close(g.kick)
	g.mu.Unlock()
	<-g.done
}
