package ownership

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
)

// MemoryLeases is Leases in one process, for several Replicas of a test: the live set, the
// leases, the handed-over requests and the inboxes in maps, with the Redis journal's
// semantics (leases and heartbeats expire on the clock). The agents with stored state are
// those the journal the replicas' state shares holds contexts of. Commits are not fenced: a
// journal other than Redis ignores convstore.Fence.
type MemoryLeases struct {
	journal convstore.Journal
	now     func() time.Time

	mu       sync.Mutex
	live     map[string]time.Time // replica → heartbeat deadline
	owners   map[string]lease     // agent → lease
	handled  map[string]handedOver
	inboxes  map[string][]conversation.Event
	watchers map[chan struct{}]bool
}

type lease struct {
	token string
	until time.Time
}

type handedOver struct {
	corrs [][]byte
	until time.Time
}

// NewMemoryLeases is MemoryLeases over the journal the replicas' state shares.
func NewMemoryLeases(journal convstore.Journal) *MemoryLeases {
	return &MemoryLeases{journal: journal, now: time.Now, live: map[string]time.Time{}, owners: map[string]lease{},
		handled: map[string]handedOver{}, inboxes: map[string][]conversation.Event{},
		watchers: map[chan struct{}]bool{}}
}

var _ Leases = (*MemoryLeases)(nil)

// Heartbeat records replica as live until now+ttl and returns the live replicas (sorted).
func (m *MemoryLeases) Heartbeat(_ context.Context, replica string, ttl time.Duration) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.live[replica] = now.Add(ttl)
	var out []string
	for r, until := range m.live {
		if !until.After(now) {
			delete(m.live, r)
			continue
		}
		out = append(out, r)
	}
	slices.Sort(out)
	return out, nil
}

// Leave removes replica from the live set and tells the others.
func (m *MemoryLeases) Leave(ctx context.Context, replica string) error {
	m.mu.Lock()
	delete(m.live, replica)
	m.mu.Unlock()
	return m.AnnounceChange(ctx)
}

// AnnounceChange wakes every WatchChanges.
func (m *MemoryLeases) AnnounceChange(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ch := range m.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return nil
}

// WatchChanges calls fn whenever a replica announces a change, until ctx ends.
func (m *MemoryLeases) WatchChanges(ctx context.Context, fn func()) {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.watchers[ch] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.watchers, ch)
		m.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			fn()
		}
	}
}

// Agents lists the agents the journal holds contexts of.
func (m *MemoryLeases) Agents(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	err := m.journal.Load(ctx, "", func(agent string, _ *conversation.Context, _ []*convstore.Item) error {
		seen[agent] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	slices.Sort(out)
	return out, nil
}

// ForgetAgent has nothing to do: an agent without contexts is not among Agents.
func (m *MemoryLeases) ForgetAgent(context.Context, string) error { return nil }

// TakeOver takes agent's lease for token if it is free, expired, token's, or held by a token
// starting with incarnation.
func (m *MemoryLeases) TakeOver(_ context.Context, agent, token, incarnation string, ttl time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.acquireLocked(agent, token, incarnation, ttl), nil
}

func (m *MemoryLeases) acquireLocked(agent, token, incarnation string, ttl time.Duration) bool {
	now := m.now()
	cur, ok := m.owners[agent]
	if ok && cur.until.After(now) && cur.token != token && (incarnation == "" || !strings.HasPrefix(cur.token, incarnation)) {
		return false
	}
	m.owners[agent] = lease{token: token, until: now.Add(ttl)}
	return true
}

// RenewLeases renews token's leases on agents (as TakeOver without an incarnation).
func (m *MemoryLeases) RenewLeases(_ context.Context, agents []string, token string, ttl time.Duration) ([]bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := make([]bool, len(agents))
	for i, agent := range agents {
		held[i] = m.acquireLocked(agent, token, "", ttl)
	}
	return held, nil
}

// Release gives agent's lease up if token holds it.
func (m *MemoryLeases) Release(_ context.Context, agent, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners[agent].token == token {
		delete(m.owners, agent)
	}
	return nil
}

// ReleaseLeases gives up the leases token holds among agents.
func (m *MemoryLeases) ReleaseLeases(ctx context.Context, agents []string, token string) error {
	for _, agent := range agents {
		_ = m.Release(ctx, agent, token)
	}
	return nil
}

// RecordHandled keeps corrs for agent's next owner for ttl (added to what is kept).
func (m *MemoryLeases) RecordHandled(_ context.Context, agent string, corrs [][]byte, ttl time.Duration) error {
	if len(corrs) == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.handled[agent]
	if !h.until.After(m.now()) {
		h = handedOver{}
	}
	for _, c := range corrs {
		if !slices.ContainsFunc(h.corrs, func(k []byte) bool { return bytes.Equal(k, c) }) {
			h.corrs = append(h.corrs, bytes.Clone(c))
		}
	}
	h.until = m.now().Add(ttl)
	m.handled[agent] = h
	return nil
}

// Handled returns what RecordHandled kept for agent (nil when nothing is).
func (m *MemoryLeases) Handled(_ context.Context, agent string) ([][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.handled[agent]
	if !h.until.After(m.now()) {
		return nil, nil
	}
	return slices.Clone(h.corrs), nil
}

// PushEvent hands an event of agent's task to its owner.
func (m *MemoryLeases) PushEvent(_ context.Context, agent string, ev conversation.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	// What the Redis inbox keeps of an event, no more.
	kept := conversation.Event{Kind: ev.Kind, TaskID: ev.TaskID, ContextID: ev.ContextID, State: ev.State,
		Correlation: bytes.Clone(ev.Correlation), Final: ev.Final}
	m.inboxes[agent] = append(m.inboxes[agent], kept)
	return nil
}

// PopEvents takes up to n events from agent's inbox.
func (m *MemoryLeases) PopEvents(_ context.Context, agent string, n int) ([]conversation.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.popLocked(agent, n), nil
}

func (m *MemoryLeases) popLocked(agent string, n int) []conversation.Event {
	q := m.inboxes[agent]
	k := min(n, len(q))
	if k == 0 {
		return nil
	}
	out := slices.Clone(q[:k])
	if k == len(q) {
		delete(m.inboxes, agent)
	} else {
		m.inboxes[agent] = q[k:]
	}
	return out
}

// PopInboxes takes up to n events from the inbox of each of agents.
func (m *MemoryLeases) PopInboxes(_ context.Context, agents []string, n int) (map[string][]conversation.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]conversation.Event{}
	for _, agent := range agents {
		if evs := m.popLocked(agent, n); len(evs) > 0 {
			out[agent] = evs
		}
	}
	return out, nil
}
