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

	// heldTurnAcrossMove sends a turn in context ctxID that the agent answers
	// only after the agent moved to the replica spawn starts (its assigned
	// one once it runs), so the completion reaches the replica that
	// forwarded the request and no longer owns the agent. It returns the
	// turn's task id once the requester has the completion.
	heldTurnAcrossMove := func(ctxID, to string, spawn func()) string {
		t.Helper()
		task := uuid.NewString()
		done := make(chan error, 1)
		seen := len(agent.received())
		go func() {
			res, err := send(ctx, guarded, task, ctxID, "hold on")
			if err == nil && state(res) != a2a.TaskStateCompleted {
				err = fmt.Errorf("state %s", state(res))
			}
			done <- err
		}()
		eventually(t, 10*time.Second, "the agent received the held turn", func() error {
			if len(agent.received()) == seen {
				return errors.New("not yet")
			}
			return nil
		})
		spawn()
		eventually(t, 30*time.Second, "lease moved to "+to, func() error {
			if h := holder(); h != to {
				return fmt.Errorf("held by %q", h)
			}
			return nil
		})
		agent.held <- struct{}{}
		if err := <-done; err != nil {
			t.Fatalf("held turn: %v", err)
		}
		return task
	}

	// 1. The follow-up's decision: the agent moves from first to its
	// assigned replica; the next turn goes out as soon as the completion is in.
	heldTurnAcrossMove(c, owner, func() { st.spawnService(t, owner, store) })
	next, err := send(ctx, guarded, uuid.NewString(), c, "right after")
	if err != nil || state(next) != a2a.TaskStateCompleted {
		t.Fatalf("the follow-up right after the handed-over completion: %v %v", err, state(next))
	}

	// 2. A history query right after such a completion shows it: the agent
	// moves again, to a third replica it is assigned to once that one runs.
	third := ""
	for i := 0; third == ""; i++ {
		if n := fmt.Sprintf("inbox-c%d", i); convservice.AssignedReplica(ref("guarded").String(), append(names, n)) == n {
			third = n
		}
	}
	c2 := uuid.NewString()
	task := heldTurnAcrossMove(c2, third, func() { st.spawnService(t, third, store) })
	got, err := r.Transport(identity.Service).GetTask(ctx, nil, &a2a.GetTaskRequest{Tenant: ref("guarded").String(), ID: a2a.TaskID(task)})
	if err != nil || got.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("history right after the handed-over completion: %v %+v", err, got)
	}
}
