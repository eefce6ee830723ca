package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestFloodingCallerCannotLockOutAnother: the governed agent allows 6 active contexts and its
// policy says nothing about callers, so each caller gets the fair share. One caller opens new
// conversations until it is refused; it is refused with -32062 (scope caller) after its share,
// ceil(6/2) = 3, and another caller's new conversations still start (before the per-caller
// share, the flooder took all 6 and the other caller got -32062 for every new conversation).
func TestFloodingCallerCannotLockOutAnother(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newStack(t, ctx, "embedded")
	(&unstructuredPolicy{name: "governed", ns: st.ns}).patch(t, ctx, `{"spec":{"maxActiveContextsPerAgent":6}}`)
	eventually(t, 30*time.Second, "the policy's limit stored", func() error {
		p := &a2av1.ConversationPolicy{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: "governed"}, p); err != nil {
			return err
		}
		if p.Spec.MaxActiveContextsPerAgent != 6 {
			return fmt.Errorf("limit %d", p.Spec.MaxActiveContextsPerAgent)
		}
		return nil
	})
	st.startService(t, ctx, &clock{}, "r1")
	startSDKAgent(t, ctx, st, agents.KindEcho, "memory", 0)
	flooder := st.requester(t, ctx).Transport(ref("memory"))
	other := st.requesterAs(t, ctx, "direct").Transport(ref("memory"))

	// The service read the policy at its start: the fourth new conversation is refused.
	opened := 0
	var refusal error
	for range 10 {
		if _, err := send(ctx, flooder, uuid.NewString(), uuid.NewString(), "flood"); err != nil {
			if refusal == nil {
				refusal = err
			}
			continue
		}
		opened++
	}
	var rpc *a2amqtt.RPCError
	var data struct {
		Scope string `json:"scope"`
	}
	if !errors.As(refusal, &rpc) || rpc.Code != conversation.CodeActiveContextsLimit || rpc.A2AError() != conversation.A2AErrorActiveContextsLimit ||
		json.Unmarshal(rpc.Data, &data) != nil || data.Scope != "caller" {
		t.Fatalf("the flooder's refusal: %v, want -32062 active_contexts_limit with scope caller", refusal)
	}
	if opened != 3 {
		t.Fatalf("the flooder opened %d conversations, want its share of 3", opened)
	}
	for i := range 2 {
		res, err := send(ctx, other, uuid.NewString(), uuid.NewString(), "hello")
		if err != nil || state(res) != a2a.TaskStateCompleted {
			t.Fatalf("the other caller's new conversation %d with the flooder at its share: %v %v", i+1, err, state(res))
		}
	}
	t.Logf("the flooder opened %d conversations and was refused (%v); the other caller opened 2", opened, refusal)
}
