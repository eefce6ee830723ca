package convstore

import (
	"context"
	"sync"
	"time"

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
	var prevTasks []*conversation.Task
	if old != nil {
		prevTasks = old.Tasks
	}
	if len(prevTasks) > smallTaskList {
		return changeOfLong(ch, prevTasks, n.Tasks)
	}
	// A context's tasks keep their order (new ones are appended, dropped
	// ones removed): walk both lists in step, looking elsewhere only when
	// out of step; no map for the usual handful of tasks.
	var seenBuf [smallTaskList]bool
	seen := seenBuf[:len(prevTasks)]
	j := 0
	for _, t := range n.Tasks {
		k := -1
		if j < len(prevTasks) && prevTasks[j].ID == t.ID {
			k = j
		} else {
			for x, p := range prevTasks {
				if !seen[x] && p.ID == t.ID {
					k = x
					break
				}
			}
		}
		if k >= 0 {
			seen[k], j = true, k+1
			if prevTasks[k] == t {
				continue
			}
		}
		ch.Put = append(ch.Put, TaskRecord{ID: t.ID, Data: encodeTask(t)})
	}
	for x, p := range prevTasks {
		if !seen[x] {
			ch.Del = append(ch.Del, p.ID)
		}
	}
	return ch
}

// smallTaskList is the longest task list changeOf matches without a map.
const smallTaskList = 64

// changeOfLong is changeOf's task records for long task lists, with a map.
func changeOfLong(ch Change, prevTasks, tasks []*conversation.Task) Change {
	before := make(map[string]*conversation.Task, len(prevTasks))
	for _, t := range prevTasks {
		before[t.ID] = t
	}
	for _, t := range tasks {
		if prev, ok := before[t.ID]; ok {
			delete(before, t.ID)
			if prev == t {
				continue
			}
		}
		ch.Put = append(ch.Put, TaskRecord{ID: t.ID, Data: encodeTask(t)})
	}
	for _, t := range prevTasks {
		if _, ok := before[t.ID]; ok {
			ch.Del = append(ch.Del, t.ID)
		}
	}
	return ch
}

// Ticket reports when a group of appended changes is durable.
type Ticket struct {
	done chan struct{}
	err  error
	// g, when set, lets the waiter commit its group itself (groupCommitter.lead).
	g *groupCommitter
	// ready is closed when the commit before this ticket's group ended and
	// the group may be led by one of its waiters.
	ready chan struct{}
	// then are the continuations of the group (Then), in order; guarded by
	// g.mu until done is closed, then taken by the goroutine that committed.
	then []func(error)
}

func newTicket() *Ticket { return &Ticket{done: make(chan struct{})} }

// Wait blocks until the changes are durable (nil) or the commit failed. A
// nil Ticket (nothing was appended) is durable at once. When no commit is
// running, the waiter commits its group itself, on its own goroutine: the
// durable path hands nothing to another thread (on a VM, waking an idle
// core costs tens of microseconds, docs/benchmarks.md). A leader returns
// when its commit ends, even if ctx ends first (others wait on it too): the
// store's own timeout bounds it (Redis: 10 s; the service's handlers allow
// 30 s).
func (t *Ticket) Wait(ctx context.Context) error {
	if t == nil {
		return nil
	}
	ready := t.ready
	for t.g != nil {
		if t.g.lead(t) {
			break
		}
		select {
		case <-t.done:
			return t.err
		case <-ready:
			// The commit before ours ended: try to lead ours. Whoever leads
			// next commits our group, so if another waiter (or the timer)
			// wins, ours is done when its commit is.
			ready = nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Then runs fn once the changes are durable (nil) or their commit failed,
// without waiting for it: the goroutine that commits the group runs the
// group's continuations in the order Then was called, right after the
// commit. That is this goroutine when no commit is running (it commits the
// group itself, as a lone waiter does: no hand-off on the durable path);
// otherwise the commit's leader hands the group to the journal's committer
// goroutine when it ends, so concurrent callers neither park nor wake up one
// by one. The next group's commit runs while a group's continuations do, so
// continuations of different groups may run concurrently (as waiters of
// different groups wake in any order). fn must not block for long: the
// continuations after it in the group wait for it. A nil Ticket runs fn at
// once.
func (t *Ticket) Then(fn func(error)) {
	if t == nil {
		fn(nil)
		return
	}
	g := t.g
	if g == nil {
		// A ticket born done (a closed journal).
		<-t.done
		fn(t.err)
		return
	}
	g.mu.Lock()
	if isClosed(t.done) {
		g.mu.Unlock()
		fn(t.err)
		return
	}
	t.then = append(t.then, fn)
	g.mu.Unlock()
	// Lead the group now if no commit runs; otherwise the running leader
	// hands it on when it ends (lead).
	g.lead(nil)
}

// groupCommitter commits groups of changes one at a time. Changes appended
// while a commit (and its fsync) runs form the next group, committed as soon
// as the current one ends: no timer delays a change someone waits for.
// A waiter leads: it commits the pending group itself when no commit runs
// (Ticket.Wait), so a lone request's durable write costs no hand-off to
// another goroutine, and concurrent ones share one transaction and one sync.
// Changes nobody waits for (a stream's intermediate events, recovery
// bookkeeping) are committed by the next waiter's group or, at the latest,
// flushDelay after they were appended, by a timer. (bbolt's DB.Batch waits
// MaxBatchDelay first; measured worse.)
type groupCommitter struct {
	commit func([]Change) error
	// kick wakes the committer goroutine (committer) for a group that has
	// continuations (Then) and no waiter to lead it.
	kick     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	mu         sync.Mutex
	pending    []Change
	cur        *Ticket // the ticket of the pending group
	committing bool    // a leader is committing a group now
	running    int     // groups whose continuations run now (close waits for them)
	timer      *time.Timer
	timerSet   bool
	closed     bool
	idle       *sync.Cond // on mu: signalled when a commit ends (close waits for it)
}

// flushDelay bounds how long an appended change nobody waits for stays
// uncommitted.
const flushDelay = 2 * time.Millisecond

func newGroupCommitter(commit func([]Change) error) *groupCommitter {
	g := &groupCommitter{commit: commit, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	g.idle = sync.NewCond(&g.mu)
	g.cur = g.newTicket()
	g.timer = time.AfterFunc(time.Hour, g.flush)
	g.timer.Stop()
	go g.committer()
	return g
}

// committer leads the groups whose continuations nobody else runs: a group
// that formed while another commit ran, with no waiter to lead it.
func (g *groupCommitter) committer() {
	defer close(g.done)
	for {
		select {
		case <-g.kick:
			g.lead(nil)
		case <-g.stop:
			return
		}
	}
}

func (g *groupCommitter) newTicket() *Ticket {
	t := newTicket()
	t.g, t.ready = g, make(chan struct{})
	return t
}

func (g *groupCommitter) Append(changes ...Change) *Ticket {
	if len(changes) == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		t := newTicket()
		t.err = ErrClosed
		close(t.done)
		return t
	}
	g.pending = append(g.pending, changes...)
	g.armLocked()
	return g.cur
}

// armLocked makes sure the flush timer runs for pending changes.
func (g *groupCommitter) armLocked() {
	if !g.timerSet && len(g.pending) > 0 && !g.closed {
		g.timerSet = true
		g.timer.Reset(flushDelay)
	}
}

// flush commits what nobody waited for.
func (g *groupCommitter) flush() {
	g.mu.Lock()
	g.timerSet = false
	g.mu.Unlock()
	g.lead(nil)
}

// lead commits groups while there are pending changes and no other commit
// runs, until t's group (any group, for nil t) is committed. It returns
// false, committing nothing, when another leader is committing: that one
// closes the next group's ready channel when it ends.
func (g *groupCommitter) lead(t *Ticket) bool {
	for {
		g.mu.Lock()
		if t != nil && isClosed(t.done) {
			g.mu.Unlock()
			return true
		}
		if g.committing {
			g.mu.Unlock()
			return false
		}
		batch, bt := g.pending, g.cur
		if len(batch) == 0 {
			g.mu.Unlock()
			return true
		}
		g.pending, g.cur, g.committing = nil, g.newTicket(), true
		g.mu.Unlock()

		err := g.commit(batch)

		g.mu.Lock()
		bt.err = err
		close(bt.done)
		then := bt.then
		bt.then = nil
		g.committing = false
		if len(then) > 0 {
			g.running++
		}
		g.idle.Broadcast()
		if len(g.pending) > 0 {
			// The next group's waiters may lead it; its continuations, if
			// any, go to the committer; the timer covers it when nobody
			// waits.
			close(g.cur.ready)
			if len(g.cur.then) > 0 {
				select {
				case g.kick <- struct{}{}:
				default: // already kicked
				}
			}
			g.armLocked()
		}
		g.mu.Unlock()
		// After handing the next group on: its commit runs while these run.
		if len(then) > 0 {
			for _, fn := range then {
				fn(err)
			}
			g.mu.Lock()
			g.running--
			g.idle.Broadcast()
			g.mu.Unlock()
		}
		if t == nil || bt == t {
			return true
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// close commits what is pending and stops the committer: nothing is
// appended after it, and it returns once no commit runs and nothing is
// pending (a waiter may still be leading the last group).
func (g *groupCommitter) close() {
	g.mu.Lock()
	g.closed = true
	g.timer.Stop()
	for {
		for g.committing || g.running > 0 {
			g.idle.Wait()
		}
		if len(g.pending) == 0 {
			g.mu.Unlock()
			break
		}
		g.mu.Unlock()
		g.lead(nil)
		g.mu.Lock()
	}
	g.stopOnce.Do(func() { close(g.stop) })
	<-g.done
}
