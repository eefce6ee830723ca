package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestServiceSurvivesRedisOutage: with its store gone, the service answers a
// request it cannot make durable (responder_unavailable, not silence) and
// reports not ready; once Redis is back (empty: this one keeps nothing on
// disk), it serves again and reports ready, without a restart. The decision
// is forwarded only once durable, so the answer comes from the continuation
// of a failed commit (Ticket.Then) or from the lost lease.
func TestServiceSurvivesRedisOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	rd := startRedisAt(t, addr)
	st := newStack(t, ctx, "mosquitto")
	startRawAgent(t, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	svc := st.startServiceCfg(t, ctx, &clock{}, "redis-outage", func(c *convservice.Config) {
		c.Store = "redis://" + addr + "/0"
		c.LeaseTTL = 3 * time.Second
	})
	r := st.requester(t, ctx)
	quick, err := a2amqtt.NewRequester(ctx, r.Conn(), a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 5 * time.Second, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	tr := quick.Transport(ref("raw"))
	ok := func() error {
		res, err := send(ctx, tr, uuid.NewString(), uuid.NewString(), "hello")
		if err != nil || state(res) != a2a.TaskStateCompleted {
			return fmt.Errorf("%v %v", err, state(res))
		}
		return nil
	}
	eventually(t, 20*time.Second, "served with Redis up", ok)

	_ = rd.Process.Kill()
	_ = rd.Wait()
	down := time.Now()
	_, err = send(ctx, tr, uuid.NewString(), uuid.NewString(), "anyone?")
	if code, _ := rpcCode(err); code != a2amqtt.CodeResponderUnavailable {
		t.Fatalf("with Redis down: %v (code %d), want responder_unavailable", err, code)
	}
	t.Logf("answered responder_unavailable %s after Redis went down: %v", time.Since(down).Round(time.Millisecond), err)
	eventually(t, 20*time.Second, "not ready while Redis is down", func() error {
		if svc.Ready(ctx) == nil {
			return fmt.Errorf("still ready")
		}
		return nil
	})

	startRedisAt(t, addr)
	back := time.Now()
	eventually(t, 45*time.Second, "served again once Redis is back", ok)
	eventually(t, 20*time.Second, "ready again", func() error { return svc.Ready(ctx) })
	t.Logf("served and ready again %s after Redis came back", time.Since(back).Round(time.Millisecond))
}
