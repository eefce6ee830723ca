package registration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestPoolOnABrokerThatCannotServeIt: on Mosquitto, whose 2.0 never delivers $-topics to
// shared subscriptions, an Agent with a poolID is registered (it may connect) but is never
// Ready: Ready=False with reason PoolUnsupportedByBroker and a Warning Event say why. On the
// embedded broker the same Agent is Ready. The operator is configured as cmd/manager configures
// it for each broker (PoolsUnsupportedOnMosquitto for the dynsec backend).
func TestPoolOnABrokerThatCannotServeIt(t *testing.T) {
	for _, kind := range testenv.BrokerKinds {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			b := testenv.StartBroker(t, ctx, kind)
			opts := controllers.Options{}
			if kind == "mosquitto" {
				opts.PoolsUnsupported = controllers.PoolsUnsupportedOnMosquitto
			}
			ns := cp.StartOperator(t, ctx, "pool-"+kind+"-", b.Backend, b.URL, opts)
			applyManifest(t, ctx, ns, `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: planner}
spec:
  orgID: acme
  unitID: sales
  poolID: planners
  card: {name: planner, description: plans}
`)
			key := client.ObjectKey{Namespace: ns, Name: "planner"}
			eventually(t, "the pool Agent's Ready condition", func() error {
				a := &a2av1.Agent{}
				if err := k8s.Get(ctx, key, a); err != nil {
					return err
				}
				registered := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionRegistered)
				ready := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionReady)
				if registered == nil || registered.Status != metav1.ConditionTrue || ready == nil {
					return fmt.Errorf("not registered yet: %+v", a.Status.Conditions)
				}
				switch kind {
				case "mosquitto":
					if ready.Status != metav1.ConditionFalse || ready.Reason != a2av1.ReasonPoolUnsupportedByBroker ||
						!strings.Contains(ready.Message, "pool planners") || !strings.Contains(ready.Message, "shared subscriptions") {
						return fmt.Errorf("Ready = %s %s %q, want False %s naming the pool and why", ready.Status, ready.Reason, ready.Message, a2av1.ReasonPoolUnsupportedByBroker)
					}
				default:
					if ready.Status != metav1.ConditionTrue {
						return fmt.Errorf("Ready = %s %s %q, want True on a broker that serves pools", ready.Status, ready.Reason, ready.Message)
					}
				}
				return nil
			})
			if kind == "mosquitto" {
				eventually(t, "a Warning Event on the pool Agent", func() error {
					return findEvent(ctx, key, a2av1.ReasonPoolUnsupportedByBroker)
				})
			}
		})
	}
}
