package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// TestFollowUpAfterHandOverFindsSlotFree: a turn's completion that reaches
// the replica which forwarded its request after the agent moved to another
// replica is handed to the new owner through Redis (the agent's inbox). A
// follow-up the requester sends right after that completion must find the
// slot free (maxConcurrentTasksPerContext 1), without waiting for the new
// owner's next round (every 5 s with the default 15 s lease).
func TestFollowUpAfterHandOverFindsSlotFree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := newStack(t, ctx, "mosquitto")
	agent := startRawAgent(t, ctx, st.addr, st.usernames["guarded"], st.passwords["guarded"], ref("guarded"), identity.DeliveryTopic(ref("guarded")))
	r := st.requester(t, ctx)
	addr := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	holder := func() string {
		v, _ := rdb.Get(ctx, "a2af:{"+ref("guarded").String()+"}:owner").Result()
		replica, _, _ := strings.Cut(v, "/")
		return replica
	}
	store := "redis://" + addr + "/0"
	names := []string{"inbox-a", "inbox-b"}
	owner := convservice.AssignedReplica(ref("guarded").String(), names)
	first := names[0]
	if first == owner {
		first = names[1]
	}
	// Alone, the replica that is not the agent's assigned one owns it.
	st.spawnService(t, first, store)
	guarded := r.Transport(ref("guarded"))
	c := uuid.NewString()
	eventually(t, 30*time.Second, first+" serves the agent", func() error {
		_, err := send(ctx, guarded, uuid.NewString(), c, "warm up")
		return err
	})

	// A turn forwarded by first; the agent holds its reply.
	type result struct {
		state a2a.TaskState
		err   error
	}
	done := make(chan result, 1)
	seen := len(agent.received())
	go func() {
		res, err := send(ctx, guarded, uuid.NewString(), c, "hold on")
		done <- result{state(res), err}
	}()
	eventually(t, 10*time.Second, "the agent received the held turn", func() error {
		if len(agent.received()) == seen {
			return errors.New("not yet")
		}
		return nil
	})
	// The agent moves: its assigned replica joins and takes it over.
	st.spawnService(t, owner, store)
	eventually(t, 30*time.Second, "lease moved to "+owner, func() error {
		if h := holder(); h != owner {
			return fmt.Errorf("held by %q", h)
		}
		return nil
	})
	// The completion reaches first, which no longer owns the agent; the
	// requester sends the next turn as soon as it has it.
	agent.held <- struct{}{}
	res := <-done
	if res.err != nil || res.state != a2a.TaskStateCompleted {
		t.Fatalf("held turn: %v %v", res.err, res.state)
	}
	next, err := send(ctx, guarded, uuid.NewString(), c, "right after")
	if err != nil || state(next) != a2a.TaskStateCompleted {
		t.Fatalf("the follow-up right after the handed-over completion: %v %v", err, state(next))
	}
}
