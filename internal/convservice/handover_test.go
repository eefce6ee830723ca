package convservice

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/ownership"
)

// gatedKeys is a fixed set of gated agents (ownership.Agents) under the default policy.
type gatedKeys []string

func (g gatedKeys) Keys() []string                      { return slices.Clone(g) }
func (g gatedKeys) Gated(agent string) bool             { return slices.Contains(g, agent) }
func (g gatedKeys) PolicyOf(string) conversation.Policy { return conversation.DefaultPolicy() }
func (g gatedKeys) Resubscribe()                        {}
func (g gatedKeys) assignedTo(replica string, live []string) string {
	for _, a := range g {
		if AssignedReplica(a, live) == replica {
			return a
		}
	}
	return ""
}

// staleTopics records the request topics the handover asked the registry to drop.
type staleTopics struct {
	mu     sync.Mutex
	topics []string
}

func (s *staleTopics) dropStale(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.topics = append(s.topics, topic)
}

// replicas are two replicas' shares over one in-memory lease store and one bolt journal.
func replicas(t *testing.T, agents gatedKeys) (r1, r2 *ownership.Replica) {
	t.Helper()
	j, err := convstore.OpenBoltJournal(filepath.Join(t.TempDir(), "state.db"), &convstore.BoltOptions{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	leases := ownership.NewMemoryLeases(j)
	replica := func(id string) *ownership.Replica {
		return ownership.New(ownership.Config{Replica: id, TTL: 10 * time.Second, Now: time.Now, Log: logr.Discard()},
			leases, convstore.NewMemory(j, false), agents)
	}
	return replica("r1"), replica("r2")
}

// testHandover is the handover part of replica r (nil: the only replica), on running workers.
func testHandover(t *testing.T, owners agentOwners, stale staleDropper) *handover {
	t.Helper()
	started, quit := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	work := newWorkers(2, started, quit, &wg)
	close(started)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); close(quit); wg.Wait() })
	e := env{cfg: Config{HandoverWait: 10 * time.Second}, log: logr.Discard(), m: newMetrics(prometheus.NewRegistry())}
	return newHandover(e, work, nil, stale, owners, ctx)
}

func agentNames(n int) gatedKeys {
	out := make(gatedKeys, n)
	for i := range out {
		out[i] = fmt.Sprintf("org/unit/agent-%d", i)
	}
	return out
}

func TestHistoryRoleFollowsTheOwnership(t *testing.T) {
	agents := agentNames(16)
	r1, r2 := replicas(t, agents)
	live := []string{"r1", "r2"}
	mine, theirs := agents.assignedTo("r1", live), agents.assignedTo("r2", live)
	if mine == "" || theirs == "" {
		t.Fatalf("no agent assigned to each replica among %v", agents)
	}
	h := testHandover(t, r1, &staleTopics{})
	if got := h.historyRole(mine); got != historyUnavailable {
		t.Fatalf("gated agent not taken over yet: role %v, want historyUnavailable", got)
	}
	ctx := context.Background()
	r1.Rebalance(ctx)
	r2.Rebalance(ctx)
	r1.Rebalance(ctx) // sees r2 live: hands its share over
	r2.Rebalance(ctx)
	if got := h.historyRole(mine); got != historyAnswer {
		t.Fatalf("held agent: role %v, want historyAnswer", got)
	}
	if got := h.historyRole(theirs); got != historyIgnore {
		t.Fatalf("agent of the other replica: role %v, want historyIgnore", got)
	}
	// An agent nobody has state for is answered (from nothing) by its assigned replica only.
	var unknownMine, unknownTheirs string
	for i := 0; unknownMine == "" || unknownTheirs == ""; i++ {
		a := fmt.Sprintf("org/unit/unknown-%d", i)
		if AssignedReplica(a, live) == "r1" {
			unknownMine = a
		} else {
			unknownTheirs = a
		}
	}
	if got := h.historyRole(unknownMine); got != historyAnswer {
		t.Fatalf("unknown agent assigned here: role %v, want historyAnswer", got)
	}
	if got := h.historyRole(unknownTheirs); got != historyIgnore {
		t.Fatalf("unknown agent assigned elsewhere: role %v, want historyIgnore", got)
	}
	if got := testHandover(t, nil, &staleTopics{}).historyRole(theirs); got != historyAnswer {
		t.Fatalf("the only replica: role %v, want historyAnswer", got)
	}
}

func TestRequestForAnAgentElsewhereIsLeftToItsOwner(t *testing.T) {
	agents := agentNames(16)
	r1, r2 := replicas(t, agents)
	ctx := context.Background()
	r1.Rebalance(ctx)
	r2.Rebalance(ctx)
	r1.Rebalance(ctx)
	theirs := agents.assignedTo("r2", []string{"r1", "r2"})
	stale := &staleTopics{}
	h := testHandover(t, r1, stale)
	in := &inbound{topic: "request-topic-of-" + theirs, corr: []byte("c1"), received: time.Now()}
	if !h.notHeld(in, theirs, func() { t.Error("a request left to another replica was retried here") }) {
		t.Fatal("a request for an agent another replica serves was not left to it")
	}
	if !slices.Equal(stale.topics, []string{in.topic}) {
		t.Fatalf("dropped stale topics %v, want [%s]", stale.topics, in.topic)
	}
	if in.parked {
		t.Fatal("a request left to another replica was parked")
	}
}

func TestParkedRequestRunsOnceTheAgentIsHeld(t *testing.T) {
	agents := agentNames(1)
	r1, _ := replicas(t, agents)
	h := testHandover(t, r1, &staleTopics{})
	agent := agents[0]
	retried := make(chan struct{})
	in := &inbound{topic: "t", corr: []byte("c1"), received: time.Now()}
	if !h.notHeld(in, agent, func() { close(retried) }) {
		t.Fatal("a request for an agent assigned here but not held was not parked")
	}
	select {
	case <-retried:
		t.Fatal("the parked request ran before the agent was held")
	case <-time.After(50 * time.Millisecond):
	}
	r1.Rebalance(context.Background())
	select {
	case <-retried:
	case <-time.After(10 * time.Second):
		t.Fatal("the parked request did not run once the agent was held")
	}
	if h.parkUntilHeld(in, agent, func() {}) {
		t.Fatal("a request was parked twice")
	}
}
