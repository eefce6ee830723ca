package a2amqtt

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// TestCancelRunningTask: CancelTask stops a running execution and leaves
// the task CANCELED; a failing executor leaves its task FAILED. Both
// handlers must agree.
func TestCancelRunningTask(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		exec := &scriptExec{fn: func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
			if messageText(ec.Message) == "explode" {
				yield(nil, errors.New("boom"))
				return
			}
			if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil) {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(3 * time.Second):
				yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
			}
		}}
		serveT(t, b, agentB, exec, mode)
		tr := requesterT(t, b, agentA, nil).Transport(agentB)
		ctx := ctxT(t, 10*time.Second)

		req := userText("long job")
		req, _ = prepareSend(req)
		working := make(chan struct{})
		go func() {
			for ev, err := range tr.SendStreamingMessage(ctx, nil, req) {
				if su, ok := ev.(*a2a.TaskStatusUpdateEvent); ok && err == nil && su.Status.State == a2a.TaskStateWorking {
					close(working)
				}
			}
		}()
		select {
		case <-working:
		case <-ctx.Done():
			t.Fatal("task never started working")
		}
		start := time.Now()
		task, err := tr.CancelTask(ctx, nil, &a2a.CancelTaskRequest{ID: req.Message.TaskID})
		if err != nil || task.Status.State != a2a.TaskStateCanceled {
			t.Fatalf("CancelTask: %+v %v", task, err)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("cancel waited for the execution to finish (%s)", time.Since(start))
		}
		got, err := tr.GetTask(ctx, nil, &a2a.GetTaskRequest{ID: req.Message.TaskID})
		if err != nil || got.Status.State != a2a.TaskStateCanceled {
			t.Fatalf("after cancel: %+v %v", got, err)
		}

		res, err := tr.SendMessage(ctx, nil, userText("explode"))
		if err == nil {
			if task, ok := res.(*a2a.Task); !ok || task.Status.State != a2a.TaskStateFailed {
				t.Fatalf("failing executor: %+v", res)
			}
		} else if !errors.Is(err, a2a.ErrInternalError) {
			t.Fatalf("failing executor: %v", err)
		}
	})
}
