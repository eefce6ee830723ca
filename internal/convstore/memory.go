package convstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// Memory is the conversation state of the agents a replica owns, decided in
// memory (one conversation.Agent per agent, behind a per-agent mutex) and
// journaled as small records. Decide, Observe and Sweep return a Ticket: the
// caller waits on it before acting on what must be durable (forwarding an
// accepted request, relaying the final event of a stream) and may ignore it
// for the rest (intermediate events are written behind).
//
// Ordering makes the guarantees hold: changes are appended to the journal
// under the agent's mutex, in the order memory changed, and group commits
// apply in append order. So when a follow-up's decision is durable, every
// change memory showed it (the completion that freed its slot) is durable
// too.
type Memory struct {
	j Journal
	// all: every agent is owned on first use (one replica on bbolt);
	// otherwise only agents Recover loaded (ownership, several replicas).
	all bool

	mu     sync.RWMutex
	agents map[string]*agentState
}

type agentState struct {
	mu      sync.Mutex
	a       *conversation.Agent
	fence   *Fence
	pending []Change              // collected by the Agent's change hook during a call
	loading bool                  // Recover: count, do not journal
	last    *Ticket               // the agent's latest append
	states  map[a2a.TaskState]int // task counts, kept by the hook (stats)
	// hist is the history content of the agent's contexts (history mode
	// Messages), by context id; the hook drops what the engine forgets.
	hist map[string]*history
	// mapped counts tasks whose agent ids differ from the requester's (a
	// core A2A server behind the service; issue 12.5).
	mapped int
	// recent is a ring of the correlation data of the last requests handled
	// (several replicas only): handed to the next owner with the agent, so
	// requests both replicas received during the hand-over are answered
	// once. recentNext is the ring's next slot once it is full.
	recent     []string
	recentNext int
	// handed are the requests the previous owner handled (its recent ring),
	// dropped as duplicates until handedUntil.
	handed      map[string]struct{}
	handedUntil time.Time
}

// recentRequests bounds the ring of requests an agent's owner remembers for
// its successor: a hand-over overlaps for milliseconds (both replicas
// consume the request topic from the new owner's subscription until the old
// owner lets the agent go), at most one ownership round if a notice is lost.
const recentRequests = 4096

// seen reports whether corr is a request the previous owner handled, and
// remembers it as handled here.
func (st *agentState) seen(corr []byte) bool {
	if len(corr) == 0 {
		return false
	}
	if st.handed != nil {
		if time.Now().After(st.handedUntil) {
			st.handed = nil
		} else if _, ok := st.handed[string(corr)]; ok {
			return true
		}
	}
	if len(st.recent) < recentRequests {
		st.recent = append(st.recent, string(corr))
	} else {
		st.recent[st.recentNext] = string(corr)
		st.recentNext = (st.recentNext + 1) % recentRequests
	}
	return false
}

// NewMemory returns state journaled to j. ownAll makes every agent owned on
// first use (a single replica); otherwise agents must be Recovered first.
func NewMemory(j Journal, ownAll bool) *Memory {
	return &Memory{j: j, all: ownAll, agents: map[string]*agentState{}}
}

func newAgentState(fence *Fence) *agentState {
	st := &agentState{a: conversation.NewAgent(), fence: fence, states: map[a2a.TaskState]int{}, hist: map[string]*history{}}
	st.a.OnChange(func(old, n *conversation.Context) {
		if old != nil {
			for _, t := range old.Tasks {
				st.states[t.State]--
				if t.AgentTaskID != "" {
					st.mapped--
				}
			}
		}
		if n != nil {
			for _, t := range n.Tasks {
				st.states[t.State]++
				if t.AgentTaskID != "" {
					st.mapped++
				}
			}
		}
		if st.loading {
			return
		}
		ch := changeOf("", old, n)
		ch.DelContent = st.forget(old, n)
		st.pending = append(st.pending, ch)
	})
	return st
}

// forget drops the history content of what a change removed: the whole
// context when it was deleted or expired, else the tasks it dropped.
func (st *agentState) forget(old, n *conversation.Context) []uint64 {
	if old == nil {
		return nil
	}
	h := st.hist[old.ID]
	if h == nil {
		return nil
	}
	if n == nil || n.Expired != nil {
		delete(st.hist, old.ID)
		del := make([]uint64, len(h.items))
		for i, it := range h.items {
			del[i] = it.Seq
		}
		return del
	}
	_, removed := conversation.TaskDiff(old, n)
	if len(removed) == 0 {
		return nil
	}
	return h.dropTasks(removed)
}

// keep adds history items of task (in context ctxID) under p's bound.
func (st *agentState) keep(p conversation.Policy, ctxID, task string, items []Item) {
	if len(items) == 0 || !p.KeepsMessages() {
		return
	}
	h := st.hist[ctxID]
	if h == nil {
		h = newHistory()
		st.hist[ctxID] = h
	}
	ch := Change{ContextID: ctxID}
	for _, it := range items {
		it.TaskID = task
		put, del := h.add(it, p.HistoryBytes())
		ch.PutContent = append(ch.PutContent, put...)
		ch.DelContent = append(ch.DelContent, del...)
	}
	if len(ch.PutContent) > 0 || len(ch.DelContent) > 0 {
		st.pending = append(st.pending, ch)
	}
}

// held returns the agent's state, locked, without creating it (reads: a
// query naming an unknown agent must not allocate state); nil when none.
func (m *Memory) held(name string) *agentState {
	m.mu.RLock()
	st := m.agents[name]
	m.mu.RUnlock()
	if st != nil {
		st.mu.Lock()
	}
	return st
}

// agent returns the agent's state, locked; the caller unlocks.
func (m *Memory) agent(name string) (*agentState, error) {
	m.mu.RLock()
	st := m.agents[name]
	m.mu.RUnlock()
	if st == nil {
		if !m.all {
			return nil, fmt.Errorf("agent %s: %w", name, ErrNotOwner)
		}
		m.mu.Lock()
		if st = m.agents[name]; st == nil {
			st = newAgentState(nil)
			m.agents[name] = st
		}
		m.mu.Unlock()
	}
	st.mu.Lock()
	return st, nil
}

// flush appends what the last call changed and unlocks the agent.
func (m *Memory) flush(name string, st *agentState) *Ticket {
	changes := st.pending
	st.pending = nil
	for i := range changes {
		changes[i].Agent = name
		changes[i].Fence = st.fence
	}
	var t *Ticket
	if len(changes) > 0 {
		t = m.j.Append(changes...)
		st.last = t
	}
	st.mu.Unlock()
	return t
}

// Decide rules on a request for agent. The Ticket is durable once the
// decision (and everything decided before it) is journaled: forward only
// then. items (the request's message, history mode Messages) are kept with
// the task when the request is accepted, in the same group commit.
func (m *Memory) Decide(agent string, p conversation.Policy, now time.Time, req conversation.Request, items ...Item) (conversation.Decision, *Ticket, error) {
	st, err := m.agent(agent)
	if err != nil {
		return conversation.Decision{}, nil, err
	}
	if !m.all && st.seen(req.Correlation) {
		// The previous owner answered it (both consumed the request topic
		// during the hand-over): a duplicate delivery.
		st.mu.Unlock()
		return conversation.Decision{Kind: conversation.KindRetry}, nil, nil
	}
	d := st.a.Decide(p, now, req)
	if d.Forward && d.Task != nil && d.Context != nil {
		st.keep(p, d.Context.ID, d.Task.ID, items)
	}
	return d, m.flush(agent, st), nil
}

// Note records a request the engine does not rule on (reads, methods it
// passes through) as handled by this replica, like Decide does, and reports
// whether the previous owner already handled it (drop it then). ErrNotOwner
// when the agent is not held here.
func (m *Memory) Note(agent string, corr []byte) (dup bool, err error) {
	st, err := m.agent(agent)
	if err != nil {
		return false, err
	}
	defer st.mu.Unlock()
	return !m.all && st.seen(corr), nil
}

// Observe applies a reply event. Wait on the Ticket before relaying an event
// that ended a stream or freed a slot (Final reports that); other events are
// written behind. items (the reply's messages and artifacts, history mode
// Messages) are kept with the event's task.
func (m *Memory) Observe(agent string, p conversation.Policy, now time.Time, ev conversation.Event, items ...Item) (conversation.Outcome, *Ticket, error) {
	st, err := m.agent(agent)
	if err != nil {
		return conversation.Outcome{}, nil, err
	}
	o := st.a.Observe(p, now, ev)
	if o.Known && o.Task != nil && o.Context != nil {
		st.keep(p, o.Context.ID, o.Task.ID, items)
	}
	return o, m.flush(agent, st), nil
}

// Final reports whether an outcome changed what a rule depends on (a slot
// freed, a stream ended, a task gone): the relay waits for its durability.
func Final(o conversation.Outcome) bool { return o.SlotFreed || o.StreamEnded || o.Delete }

// Swept is one context changed by Sweep.
type Swept struct {
	Agent string
	conversation.Expiration
}

// Sweep applies time to every owned agent (input-required and first-event
// timeouts, expiry, end of tombstones).
func (m *Memory) Sweep(policy func(agent string) conversation.Policy, now time.Time) ([]Swept, *Ticket) {
	var out []Swept
	var last *Ticket
	for _, name := range m.Agents() {
		st, err := m.agent(name)
		if err != nil {
			continue // dropped meanwhile
		}
		for _, x := range st.a.Expire(policy(name), now) {
			out = append(out, Swept{Agent: name, Expiration: x})
		}
		if t := m.flush(name, st); t != nil {
			last = t
		}
	}
	return out, last
}

// Agents lists the agents held.
func (m *Memory) Agents() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.agents))
	for name := range m.agents {
		out = append(out, name)
	}
	return out
}

// Empty reports whether the agent is held here without any context (not
// even a tombstone): its state is gone.
func (m *Memory) Empty(agent string) bool {
	st := m.held(agent)
	if st == nil {
		return false
	}
	defer st.mu.Unlock()
	n, _ := st.a.Len()
	return n == 0 && len(st.pending) == 0
}

// Owns reports whether the agent's state is held here.
func (m *Memory) Owns(agent string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.agents[agent] != nil
}

// Context returns the context (nil when unknown). Contexts are immutable
// values: the caller may read it after the call.
func (m *Memory) Context(agent, id string) *conversation.Context {
	st := m.held(agent)
	if st == nil {
		return nil
	}
	defer st.mu.Unlock()
	return st.a.Context(id)
}

// TaskContext returns the id of the context holding task.
func (m *Memory) TaskContext(agent, task string) (string, bool) {
	st := m.held(agent)
	if st == nil {
		return "", false
	}
	defer st.mu.Unlock()
	return st.a.TaskContext(task)
}

// Task returns the context holding task and the task (nil, nil when
// unknown). Both are immutable values.
func (m *Memory) Task(agent, task string) (*conversation.Context, *conversation.Task) {
	st := m.held(agent)
	if st == nil {
		return nil, nil
	}
	defer st.mu.Unlock()
	id, ok := st.a.TaskContext(task)
	if !ok {
		return nil, nil
	}
	c := st.a.Context(id)
	return c, c.Task(task)
}

// History returns the context and its history items, oldest first (items
// are immutable; the slice is the caller's).
func (m *Memory) History(agent, contextID string) (*conversation.Context, []*Item) {
	st := m.held(agent)
	if st == nil {
		return nil, nil
	}
	defer st.mu.Unlock()
	c := st.a.Context(contextID)
	if h := st.hist[contextID]; h != nil {
		return c, slices.Clone(h.items)
	}
	return c, nil
}

// MapsTaskIDs reports whether agent holds tasks whose agent-side ids differ
// from the requester's: the agent creates its own task ids (a core A2A
// server), which a replica that restarted learns again from its state.
func (m *Memory) MapsTaskIDs(agent string) bool {
	st := m.held(agent)
	if st == nil {
		return false
	}
	defer st.mu.Unlock()
	return st.mapped > 0
}

// HistoryStats returns how many history items and content bytes are held
// (every owned agent).
func (m *Memory) HistoryStats() (items, bytes int) {
	for _, name := range m.Agents() {
		st := m.held(name)
		if st == nil {
			continue
		}
		for _, h := range st.hist {
			items += len(h.items)
			bytes += h.bytes
		}
		st.mu.Unlock()
	}
	return items, bytes
}

// Stats returns the live contexts per agent and the tasks held by state,
// from counters kept as the state changes (no scan).
func (m *Memory) Stats() (live map[string]int, states map[a2a.TaskState]int) {
	live, states = map[string]int{}, map[a2a.TaskState]int{}
	for _, name := range m.Agents() {
		st, err := m.agent(name)
		if err != nil {
			continue
		}
		live[name] = st.a.Live()
		for s, n := range st.states {
			states[s] += n
		}
		st.mu.Unlock()
	}
	return live, states
}

// Recover rebuilds agents from the journal ("" = every agent stored) and
// holds them, replacing what was held for them. fence is the ownership the
// agent's future commits depend on (nil for a single replica).
func (m *Memory) Recover(ctx context.Context, agent string, fence *Fence) error {
	loaded := map[string]*agentState{}
	err := m.j.Load(ctx, agent, func(name string, c *conversation.Context, items []*Item) error {
		st := loaded[name]
		if st == nil {
			st = newAgentState(fence)
			st.loading = true
			loaded[name] = st
		}
		// Load reports the context through the change hook, which counts
		// its tasks (and, loading, journals nothing).
		if err := st.a.Load(c); err != nil {
			return err
		}
		if len(items) > 0 {
			h := newHistory()
			for _, it := range items {
				h.load(it)
			}
			st.hist[c.ID] = h
		}
		return nil
	})
	if err != nil {
		return err
	}
	if agent != "" && loaded[agent] == nil {
		loaded[agent] = newAgentState(fence)
	}
	m.mu.Lock()
	for name, st := range loaded {
		st.pending, st.loading = nil, false
		m.agents[name] = st
	}
	m.mu.Unlock()
	return nil
}

// Drop forgets an agent (its ownership moved to another replica). The
// returned Ticket is durable once everything appended for the agent is: wait
// on it before giving the agent's lease up, so the next owner recovers it.
// handled is the correlation data of the last requests handled here (Decide,
// Note), for the next owner (Handed).
func (m *Memory) Drop(agent string) (durable *Ticket, handled [][]byte) {
	m.mu.Lock()
	st := m.agents[agent]
	delete(m.agents, agent)
	m.mu.Unlock()
	if st == nil {
		return nil, nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	handled = make([][]byte, len(st.recent))
	for i, c := range st.recent {
		handled[i] = []byte(c)
	}
	return st.last, handled
}

// Handed gives a held agent the requests its previous owner handled
// (Drop's handled): until keep has passed, Decide and Note report them as
// duplicates.
func (m *Memory) Handed(agent string, handled [][]byte, keep time.Duration) {
	if len(handled) == 0 {
		return
	}
	st := m.held(agent)
	if st == nil {
		return
	}
	defer st.mu.Unlock()
	st.handed = make(map[string]struct{}, len(handled))
	for _, c := range handled {
		st.handed[string(c)] = struct{}{}
	}
	st.handedUntil = time.Now().Add(keep)
}
