package ownership

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/redistest"
)

// directory is a fixed set of gated agents under the default policy.
type directory struct {
	mu    sync.Mutex
	keys  []string
	pokes int
}

func (d *directory) Keys() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.keys)
}
func (d *directory) Gated(agent string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.keys, agent)
}
func (d *directory) PolicyOf(string) conversation.Policy { return conversation.DefaultPolicy() }
func (d *directory) Resubscribe() {
	d.mu.Lock()
	d.pokes++
	d.mu.Unlock()
}

// store opens, for one replica, its Leases and the journal its state lives in.
type store func(t *testing.T) (Leases, convstore.Journal)

// onStores runs test on MemoryLeases (over one bolt journal the replicas share) and on a
// real redis-server (a RedisJournal per replica, as in production).
func onStores(t *testing.T, test func(t *testing.T, open store)) {
	t.Run("memory", func(t *testing.T) {
		j, err := convstore.OpenBoltJournal(filepath.Join(t.TempDir(), "state.db"), &convstore.BoltOptions{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = j.Close() })
		leases := NewMemoryLeases(j)
		test(t, func(*testing.T) (Leases, convstore.Journal) { return leases, j })
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t, redistest.Options{})
		test(t, func(t *testing.T) (Leases, convstore.Journal) {
			j := convstore.NewRedisJournal(srv.Client(), "test")
			t.Cleanup(func() { _ = j.Close() })
			return j, j
		})
	})
}

func agentKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("org/unit/agent-%d", i)
	}
	return keys
}

func newReplica(t *testing.T, open store, id string, dir *directory) *Replica {
	leases, j := open(t)
	return New(Config{Replica: id, TTL: 10 * time.Second, Now: time.Now, Log: logr.Discard()}, leases, convstore.NewMemory(j, false), dir)
}

// rebalance runs rounds on every replica until no agent is waiting for another to let it go.
func rebalance(t *testing.T, replicas ...*Replica) {
	t.Helper()
	for range 5 {
		waiting := false
		for _, r := range replicas {
			waiting = r.Rebalance(context.Background()) || waiting
		}
		if !waiting {
			return
		}
	}
	t.Fatal("replicas still waiting for agents after 5 rounds")
}

func TestReplicasSplitTheAgentsByRendezvousHashing(t *testing.T) {
	onStores(t, func(t *testing.T, open store) {
		dir := &directory{keys: agentKeys(24)}
		r1, r2 := newReplica(t, open, "r1", dir), newReplica(t, open, "r2", dir)
		rebalance(t, r1)
		for _, a := range dir.keys {
			if !r1.Owns(a) {
				t.Fatalf("alone, r1 does not hold %s", a)
			}
		}
		rebalance(t, r2, r1, r2)
		live := []string{"r1", "r2"}
		counts := map[string]int{}
		for _, a := range dir.keys {
			want := AssignedReplica(a, live)
			counts[want]++
			if r1.Owns(a) == r2.Owns(a) {
				t.Fatalf("%s: held by r1 %v, by r2 %v; want exactly one (%s)", a, r1.Owns(a), r2.Owns(a), want)
			}
			if holder := map[bool]string{true: "r1", false: "r2"}[r1.Owns(a)]; holder != want {
				t.Fatalf("%s held by %s, assigned to %s", a, holder, want)
			}
			if r1.Place(a) == PlaceHere && r2.Place(a) != PlaceElsewhere {
				t.Fatalf("%s: r2 places it %v while r1 holds it", a, r2.Place(a))
			}
		}
		if counts["r1"] == 0 || counts["r2"] == 0 {
			t.Fatalf("assignment %v puts every agent on one replica", counts)
		}
		// A clean shutdown hands r2's share to r1 at its next round.
		r2.Release()
		rebalance(t, r1)
		for _, a := range dir.keys {
			if !r1.Owns(a) {
				t.Fatalf("after r2 left, r1 does not hold %s", a)
			}
		}
	})
}

func TestRestartUnderTheSameIDTakesTheLeasesBack(t *testing.T) {
	onStores(t, func(t *testing.T, open store) {
		dir := &directory{keys: agentKeys(6)}
		crashed := newReplica(t, open, "r1", dir)
		rebalance(t, crashed)
		// Another id must wait for the leases to lapse...
		other := newReplica(t, open, "r9", dir)
		if taken, busy := other.takeOver(context.Background(), dir.keys[0]); taken || !busy {
			t.Fatalf("another replica took a live lease: taken %v, busy %v", taken, busy)
		}
		// ...the same id, restarted (kill -9: nothing released), takes them at once.
		restarted := newReplica(t, open, "r1", dir)
		rebalance(t, restarted)
		for _, a := range dir.keys {
			if !restarted.Owns(a) {
				t.Fatalf("restarted r1 does not hold %s", a)
			}
		}
	})
}

func TestHandedOverEventsReachTheOwner(t *testing.T) {
	onStores(t, func(t *testing.T, open store) {
		dir := &directory{keys: agentKeys(1)}
		owner, other := newReplica(t, open, "r1", dir), newReplica(t, open, "r2", dir)
		rebalance(t, owner)
		agent := dir.keys[0]
		if owner.ApplyPending(context.Background(), agent) {
			t.Fatal("an empty inbox reported events")
		}
		other.HandOver(context.Background(), agent, conversation.Event{Kind: conversation.EventStatus, TaskID: "t1", ContextID: "c1", Correlation: []byte("x")})
		if other.ApplyPending(context.Background(), agent) {
			t.Fatal("a replica that does not hold the agent applied its inbox")
		}
		if !owner.ApplyPending(context.Background(), agent) {
			t.Fatal("the owner did not find the handed-over event")
		}
		if owner.ApplyPending(context.Background(), agent) {
			t.Fatal("the handed-over event was applied twice")
		}
	})
}

func TestAwaitHeldReturnsWhenTheAgentIsTakenOver(t *testing.T) {
	onStores(t, func(t *testing.T, open store) {
		dir := &directory{keys: agentKeys(1)}
		r := newReplica(t, open, "r1", dir)
		agent := dir.keys[0]
		if p := r.Place(agent); p != PlaceSoon {
			t.Fatalf("before the first round: place %v, want PlaceSoon", p)
		}
		if r.Consumes(agent) {
			// Before the first heartbeat nobody is known to be assigned the agent.
			t.Fatal("consumed before the first heartbeat")
		}
		done := make(chan bool, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- r.AwaitHeld(ctx, agent)
		}()
		rebalance(t, r)
		if !<-done {
			t.Fatal("AwaitHeld returned false though the agent was taken over")
		}
		if !r.Consumes(agent) {
			t.Fatal("the replica holding the agent does not consume its request topic")
		}
	})
}
