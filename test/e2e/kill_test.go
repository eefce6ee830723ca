package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestKillBetweenAnyTwoSteps kills the service (kill -9, bbolt with fsync)
// at random points of a turn, again and again, in one context with
// maxConcurrentTasksPerContext 1, and checks after every restart:
//   - no accepted request is forgotten: every task the requester saw
//     completed is in the recovered history as completed;
//   - no slot is leaked beyond the sweep: a follow-up in the same context is
//     accepted at the latest once the first-event deadline (2s here) has
//     passed for a run the crash cut off.
//
// It also counts the turns whose reply reached the requester across the
// kill (the persistent session queues them while the replica is down).
func TestKillBetweenAnyTwoSteps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	st := newStack(t, ctx, "mosquitto")
	(&unstructuredPolicy{name: "guarded", ns: st.ns}).patch(t, ctx, `{"spec":{"firstEventTimeout":"2s"}}`)
	startRawAgent(t, ctx, st.addr, st.usernames["guarded"], st.passwords["guarded"], ref("guarded"), identity.DeliveryTopic(ref("guarded")))
	r := st.requester(t, ctx)
	// The persistent session is the default; a clean start shows what it
	// buys (replies published while the replica is down are lost).
	t.Run("persistent session", func(t *testing.T) { killLoop(t, ctx, st, r, "persistent") })
	t.Run("clean start", func(t *testing.T) { killLoop(t, ctx, st, r, "clean", "--session-expiry=-1s") })
}

func killLoop(t *testing.T, ctx context.Context, st *stack, r *a2amqtt.Requester, replica string, flags ...string) {
	store := "bolt:" + filepath.Join(t.TempDir(), "state.db")
	svc := st.spawnService(t, replica, store, flags...)
	quick, err := a2amqtt.NewRequester(ctx, r.Conn(), a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 4 * time.Second, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	guarded := quick.Transport(ref("guarded"))
	c := uuid.NewString()
	var completed []string
	var acrossKill []time.Duration
	lost := 0
	const kills = 8
	for i := range kills {
		task := uuid.NewString()
		done := make(chan error, 1)
		start := time.Now()
		var took time.Duration
		go func() {
			res, err := send(ctx, guarded, task, c, "slow" /* 300ms at the agent */)
			took = time.Since(start)
			if err == nil && state(res) != a2a.TaskStateCompleted {
				err = fmt.Errorf("state %s", state(res))
			}
			done <- err
		}()
		// Anywhere from before the decision to after the relay.
		time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond)
		svc.kill()
		// A pod restart takes a while: the agent's reply (300ms of work)
		// is often published while no replica runs.
		time.Sleep(time.Second)
		svc = st.spawnService(t, replica, store, flags...)
		if err := <-done; err == nil {
			completed = append(completed, task)
			acrossKill = append(acrossKill, took)
		} else {
			lost++
			t.Logf("kill %d: turn cut off: %v", i, err)
		}
		// No slot leaked beyond the first-event deadline.
		start = time.Now()
		eventually(t, 20*time.Second, fmt.Sprintf("kill %d: a follow-up is accepted", i), func() error {
			next := uuid.NewString()
			res, err := send(ctx, guarded, next, c, "go")
			if err != nil || state(res) != a2a.TaskStateCompleted {
				return fmt.Errorf("%v %v", err, state(res))
			}
			completed = append(completed, next)
			return nil
		})
		t.Logf("kill %d: follow-up accepted after %s", i, time.Since(start).Round(10*time.Millisecond))
	}
	// Every completion the requester saw is durable.
	list, err := r.Transport(identity.Service).ListTasks(ctx, nil, &a2a.ListTasksRequest{Tenant: "acme/sales/guarded", ContextID: c})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]a2a.TaskState{}
	for _, tk := range list.Tasks {
		seen[string(tk.ID)] = tk.Status.State
	}
	for _, id := range completed {
		if seen[id] != a2a.TaskStateCompleted {
			t.Errorf("task %s completed for the requester, recovered as %q", id, seen[id])
		}
	}
	slices.Sort(acrossKill)
	median := time.Duration(0)
	if len(acrossKill) > 0 {
		median = acrossKill[len(acrossKill)/2]
	}
	t.Logf("%s: %d kills: %d turns completed across the kill (median %s), %d cut off (requester timeout 4s); %d completions, all durable",
		replica, kills, len(acrossKill), median.Round(time.Millisecond), lost, len(completed))
}
