package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestServedCardDifferenceInStatus: the gateway reads the card the HTTP agent serves and the
// Agent's CardMatches condition names the members that differ from spec.card; once spec.card says
// what the agent serves, the condition turns True.
func TestServedCardDifferenceInStatus(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, url := startPlanner(t)
		st := newStack(t, ctx, kind, url)
		reader, err := gateway.NewCachedReader(ctx, restCfg, st.ns)
		if err != nil {
			t.Fatal(err)
		}
		out := gateway.NewOutbound(gateway.OutboundConfig{Directory: &gateway.Directory{Reader: reader, Namespace: st.ns}, Status: k8s,
			Conn: gateway.ConnConfig{BrokerURL: st.brokerURL, Logger: slog.New(slog.DiscardHandler)}})
		defer out.Close(context.Background())
		key := client.ObjectKey{Namespace: st.ns, Name: "httpagent"}
		condition := func(status metav1.ConditionStatus, reason string, says ...string) func() error {
			return func() error {
				if err := out.Sync(ctx); err != nil {
					return err
				}
				ag := &a2av1.Agent{}
				if err := k8s.Get(ctx, key, ag); err != nil {
					return err
				}
				c := meta.FindStatusCondition(ag.Status.Conditions, a2av1.ConditionCardMatches)
				if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != ag.Generation {
					return fmt.Errorf("condition %+v", c)
				}
				for _, s := range says {
					if !strings.Contains(c.Message, s) {
						return fmt.Errorf("message %q does not name %s", c.Message, s)
					}
				}
				return nil
			}
		}
		testenv.Eventually(t, 30*time.Second, "CardMatches False naming the differences", condition(metav1.ConditionFalse, a2av1.ReasonServedCardDiffers,
			"description", "skills[plan]"))

		ag := &a2av1.Agent{}
		if err := k8s.Get(ctx, key, ag); err != nil {
			t.Fatal(err)
		}
		patched := ag.DeepCopy()
		patched.Spec.Card.Description = plannerCard.Description
		patched.Spec.Card.Skills = []a2av1.AgentSkill{{ID: "plan", Name: "Plan", Description: "plans a deployment", Tags: []string{"deploy"}}}
		if err := k8s.Patch(ctx, patched, client.MergeFrom(ag)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "CardMatches True once spec.card says what the agent serves", condition(metav1.ConditionTrue, a2av1.ReasonServedCardMatches))
	})
}
