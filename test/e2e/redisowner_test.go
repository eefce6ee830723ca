package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/types"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// TestRedisOwnsWhatIsStored closes two gaps of the Redis ownership (issue
// 12, phase-1 report): an agent that stops being gated still has its
// contexts swept (its owner is whoever is assigned its stored state) and is
// forgotten once they are gone; history queries about an agent are
// answered, also when no replica consumes its requests (and, for an agent
// nobody has state for, answered as empty instead of left unanswered).
func TestRedisOwnsWhatIsStored(t *testing.T) {
	onBothBrokers(t, redisOwnsWhatIsStored)
}

func redisOwnsWhatIsStored(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := startRedis(t)
	st := newStack(t, ctx, kind)
	clk := &clock{}
	const prefix = "gap"
	svc := st.startServiceCfg(t, ctx, clk, "r1", func(c *convservice.Config) {
		c.Store, c.RedisPrefix, c.LeaseTTL = "redis://"+addr+"/0", prefix, 1500*time.Millisecond
	})
	startRawAgent(t, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	client := startRawClient(t, ctx, st, "client")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	history := func(tenant, method string, params map[string]any) rpcReply {
		t.Helper()
		params["tenant"] = tenant
		got := client.call(t, ctx, identity.Service.RequestTopic(), method, params, 1)
		if len(got) != 1 {
			t.Fatalf("history %s about %s: no answer", method, tenant)
		}
		return decodeReply(t, got[0])
	}
	c := uuid.NewString()
	for range 2 {
		if w := resultTask(t, client.call(t, ctx, ref("raw").RequestTopic(), "SendMessage",
			map[string]any{"message": userMessage(uuid.NewString(), c, "hi")}, 1)[0]); w.Status.State != "TASK_STATE_COMPLETED" {
			t.Fatalf("turn: %+v", w.Status)
		}
	}

	// Stop gating raw: no policy selects it any more.
	agent := &a2av1.Agent{}
	agent.Name, agent.Namespace = "raw", st.ns
	if err := k8s.Patch(ctx, agent, crclient.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"role":null}}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "raw no longer gated", func() error {
		if slices.Contains(svc.GatedAgents(), "acme/sales/raw") {
			return fmt.Errorf("still consuming raw's requests")
		}
		return nil
	})

	t.Run("history of an agent that is no longer gated is still answered", func(t *testing.T) {
		r := history("acme/sales/raw", "ListTasks", map[string]any{"contextId": c})
		var list struct {
			Tasks []json.RawMessage `json:"tasks"`
		}
		if r.Error != nil || json.Unmarshal(r.Result, &list) != nil || len(list.Tasks) != 2 {
			t.Fatalf("ListTasks: %s %+v", r.Result, r.Error)
		}
	})

	t.Run("history of an agent nobody has state for is answered, not left unanswered", func(t *testing.T) {
		r := history("acme/sales/direct", "GetTask", map[string]any{"id": uuid.NewString()})
		if r.Error == nil || r.Error.Code != -32001 {
			t.Fatalf("GetTask: %s %+v", r.Result, r.Error)
		}
		r = history("acme/sales/direct", "ListTasks", map[string]any{"contextId": uuid.NewString()})
		if r.Error != nil || string(r.Result) == "" {
			t.Fatalf("ListTasks: %+v", r.Error)
		}
	})

	t.Run("its contexts are swept, then the agent is forgotten", func(t *testing.T) {
		// An agent without a policy keeps the defaults: idle TTL 30m.
		clk.Advance(conversation.DefaultIdleTTL + time.Minute)
		eventually(t, 20*time.Second, "the context expired", func() error {
			if r := history("acme/sales/raw", "ListTasks", map[string]any{"contextId": c}); r.Error == nil || r.Error.Code != conversation.CodeContextExpired {
				return fmt.Errorf("ListTasks after the idle TTL: %s %+v", r.Result, r.Error)
			}
			return nil
		})
		clk.Advance(conversation.DefaultTombstoneTTL + time.Minute)
		eventually(t, 20*time.Second, "raw's state gone from Redis", func() error {
			contexts, err := rdb.SCard(ctx, prefix+":{acme/sales/raw}:s").Result()
			if err != nil {
				return err
			}
			member, err := rdb.SIsMember(ctx, prefix+":agents", "acme/sales/raw").Result()
			if err != nil {
				return err
			}
			if contexts != 0 || member {
				return fmt.Errorf("%d contexts stored, listed as an agent with state: %v", contexts, member)
			}
			return nil
		})
		// A still-gated agent with no contexts is not forgotten: guarded
		// keeps its place (it has none here, it is just gated).
		if !slices.Contains(svc.GatedAgents(), "acme/sales/guarded") {
			t.Fatalf("gated agents %v", svc.GatedAgents())
		}
	})
}
