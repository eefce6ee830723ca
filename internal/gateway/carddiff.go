package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// comparedMembers are the card members an Agent's manifest states (spec.card): the bus shows the
// manifest's, so these are the ones a difference with the served card matters for. The others
// (interfaces, security schemes, signatures, icon) are the transport's or the server's own.
var comparedMembers = []string{"name", "description", "version", "documentationUrl", "provider",
	"defaultInputModes", "defaultOutputModes"}

// comparedCapabilities are the capabilities the manifest states.
var comparedCapabilities = []string{"streaming", "pushNotifications", "extensions"}

// CardDifferences names the members in which the served card differs from the manifest's:
// "description", "capabilities.streaming", "skills[deploy]" (a skill missing, added or changed),
// ... A member holding its default value (absent, null, false, "", []) is the same as absent, as
// in the signatures' canonical form.
func CardDifferences(manifest, served *a2a.AgentCard) ([]string, error) {
	m, err := cardMembers(manifest)
	if err != nil {
		return nil, err
	}
	s, err := cardMembers(served)
	if err != nil {
		return nil, err
	}
	var diffs []string
	for _, k := range comparedMembers {
		if !same(m[k], s[k]) {
			diffs = append(diffs, k)
		}
	}
	mc, sc := object(m["capabilities"]), object(s["capabilities"])
	for _, k := range comparedCapabilities {
		if !same(mc[k], sc[k]) {
			diffs = append(diffs, "capabilities."+k)
		}
	}
	ms, ss := skillsByID(m["skills"]), skillsByID(s["skills"])
	var ids []string
	for id := range ms {
		ids = append(ids, id)
	}
	for id := range ss {
		if _, ok := ms[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		if !same(ms[id], ss[id]) {
			diffs = append(diffs, "skills["+id+"]")
		}
	}
	return diffs, nil
}

func cardMembers(card *a2a.AgentCard) (map[string]any, error) {
	raw, err := json.Marshal(card)
	if err != nil {
		return nil, fmt.Errorf("encode card: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode card: %w", err)
	}
	return m, nil
}

func object(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func skillsByID(v any) map[string]any {
	out := map[string]any{}
	list, _ := v.([]any)
	for _, s := range list {
		if id, ok := object(s)["id"].(string); ok {
			out[id] = s
		}
	}
	return out
}

// same compares two JSON values in the canonical form of the card signatures (JCS, default
// values dropped).
func same(a, b any) bool {
	ca, errA := canonicalValue(a)
	cb, errB := canonicalValue(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

func canonicalValue(v any) ([]byte, error) {
	raw, err := json.Marshal(map[string]any{"v": v})
	if err != nil {
		return nil, err
	}
	return cardsig.Canonical(raw)
}

// cardFetchTimeout bounds one read of an HTTP agent's card.
const cardFetchTimeout = 3 * time.Second

// checkCard reads the card the HTTP agent serves ({url}/.well-known/agent-card.json) and sets
// the Agent's CardMatches condition when it changed. The operator patches the conditions it owns
// from its own copy, which may drop this one for a moment: every sync sets it again.
func (o *Outbound) checkCard(ctx context.Context, ag *a2av1.Agent) error {
	cond := metav1.Condition{Type: a2av1.ConditionCardMatches, ObservedGeneration: ag.Generation}
	fctx, cancel := context.WithTimeout(ctx, cardFetchTimeout)
	served, err := agentcard.NewResolver(o.cfg.HTTPClient).Resolve(fctx, ag.Spec.HTTP.URL)
	cancel()
	switch {
	case err != nil:
		cond.Status, cond.Reason = metav1.ConditionUnknown, a2av1.ReasonServedCardUnavailable
		cond.Message = truncate("the HTTP agent's card could not be read: " + err.Error())
	default:
		diffs, err := CardDifferences(registration.BuildCard(ag, identity.Of(ag), "", o.cfg.Conn.BrokerURL), served)
		if err != nil {
			return err
		}
		if len(diffs) == 0 {
			cond.Status, cond.Reason = metav1.ConditionTrue, a2av1.ReasonServedCardMatches
			cond.Message = "the card the HTTP agent serves matches spec.card"
		} else {
			cond.Status, cond.Reason = metav1.ConditionFalse, a2av1.ReasonServedCardDiffers
			cond.Message = truncate("the card the HTTP agent serves differs from spec.card in: " + strings.Join(diffs, ", "))
		}
	}
	if old := meta.FindStatusCondition(ag.Status.Conditions, a2av1.ConditionCardMatches); old != nil &&
		old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message && old.ObservedGeneration == cond.ObservedGeneration {
		return nil
	}
	before := ag.DeepCopy()
	after := ag.DeepCopy()
	meta.SetStatusCondition(&after.Status.Conditions, cond)
	// The optimistic lock keeps a stale cache from putting back the operator's older conditions
	// (the patch carries the whole list); a conflict is retried at the next sync.
	if err := o.cfg.Status.Status().Patch(ctx, after, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("set %s of %s/%s: %w", a2av1.ConditionCardMatches, ag.Namespace, ag.Name, err)
	}
	return nil
}

// truncate keeps a condition message within the API's bound (32 KiB) by a wide margin.
func truncate(s string) string {
	const maxLen = 1024
	if len(s) <= maxLen {
		return s
	}
	return s[:maxLen-3] + "..."
}
