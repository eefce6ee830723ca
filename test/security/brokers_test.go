package security_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

var (
	cp  *testenv.ControlPlane
	k8s client.Client
)

func TestMain(m *testing.M) {
	// Errors only: the attacks make the operator refuse things, which it logs at lower levels.
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel + 1)))
	testenv.Main(m, filepath.Join("..", ".."), func(c *testenv.ControlPlane) error {
		cp, k8s = c, c.Client
		return nil
	})
}

// TestAttacksOnBrokers replays the attacks of the tenancy issue that go through the broker, with
// real paho v5 clients, against the real control plane and the operator, on real Mosquitto 2.0.11
// with dynsec, on Mosquitto with the decision-table plugin, and on the embedded broker. Every
// refusal is asserted (reason codes, conditions, no data, nothing on the broker) and so is the
// absence of collateral disconnects.
func TestAttacksOnBrokers(t *testing.T) {
	for _, kind := range append(slices.Clone(testenv.BrokerKinds), testenv.TableKind) {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			b := testenv.StartBroker(t, ctx, kind)
			attackThroughBroker(t, ctx, b.Backend, b.URL, b.Addr)
		})
	}
}

// world is what the broker attacks run in: tenant acme binds namespaces a and a2, tenant globex
// binds b (units audit and ops only), squat is bound by nobody; a ConversationPolicy in a gates
// Agents labelled conversations=governed; the conversation service has its identity.
type world struct {
	a, a2, b, squat, system string
	backend                 acl.Backend
	addr                    string
}

func newWorld(t *testing.T, ctx context.Context, backend acl.Backend, brokerURL, addr string) *world {
	w := &world{backend: backend, addr: addr}
	watched := map[string]string{}
	for i, ns := range []*string{&w.a, &w.a2, &w.b, &w.squat, &w.system} {
		*ns = cp.NewNamespace(t, ctx, "sec-")
		watched[fmt.Sprint(i)] = *ns
	}
	tenant := func(name, org string, namespaces []string, units []string) {
		tn := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: a2av1.TenantSpec{OrgID: org, Namespaces: namespaces, Units: units}}
		if err := k8s.Create(ctx, tn); err != nil {
			t.Fatalf("create tenant: %v", err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), tn) })
	}
	tenant("sec-acme", "acme", []string{w.a, w.a2}, nil)
	tenant("sec-globex", "globex", []string{w.b}, []string{"audit", "ops"})
	mustCreate(t, ctx, w.a, `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed}
spec: {agentSelector: {matchLabels: {conversations: governed}}}
`)
	if err := registration.EnsureServiceCredentials(ctx, k8s, backend, client.ObjectKey{Namespace: w.system, Name: "service"}); err != nil {
		t.Fatalf("service identity: %v", err)
	}
	cp.StartOperatorWith(t, ctx, testenv.Operator{Namespaces: watched,
		Broker: registration.BrokerConfig{URL: brokerURL, Backend: backend}, Controllers: controllers.Options{Gating: true}})
	return w
}

// service connects as a conversation service replica.
func (w *world) service(t *testing.T, ctx context.Context) *mqttClient {
	t.Helper()
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.system, Name: "service"}, s); err != nil {
		t.Fatal(err)
	}
	c, err := dial(t, w.addr, string(s.Data["username"]), "a2a-fleet/system/conversation-service-0", string(s.Data["password"]))
	if err != nil {
		t.Fatalf("service: %v", err)
	}
	return c
}

func (w *world) onBroker(t *testing.T, ctx context.Context, clientID string) bool {
	t.Helper()
	st, err := w.backend.Observe(ctx, &acl.Names{Clients: []string{"a2a:" + clientID}, Roles: []string{"a2a:agent:" + clientID}})
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	return len(st.Clients)+len(st.Roles) > 0
}

func attackThroughBroker(t *testing.T, ctx context.Context, backend acl.Backend, brokerURL, addr string) {
	w := newWorld(t, ctx, backend, brokerURL, addr)
	mustCreate(t, ctx, w.a, agentYAML("alpha", "acme", "sales", "{app: alpha}", "  callers: {scope: SameUnit}\n"))
	mustCreate(t, ctx, w.a, agentYAML("bystander", "acme", "sales", "", "  callers: {scope: SameOrg}\n"))
	mustCreate(t, ctx, w.a, agentYAML("gated", "acme", "sales", "{conversations: governed}", "  callers: {scope: SameUnit}\n"))
	alpha := connectAgent(t, ctx, addr, "acme/sales/alpha", ready(t, ctx, w.a, "alpha"))
	bystander := connectAgent(t, ctx, addr, "acme/sales/bystander", ready(t, ctx, w.a, "bystander"))
	gated := connectAgent(t, ctx, addr, "acme/sales/gated", ready(t, ctx, w.a, "gated"))
	svc := w.service(t, ctx)
	eventually(t, "service reads the gated agent's requests", func() error {
		if !maySubscribe(t, ctx, svc, "$a2a/v1/request/acme/sales/gated") {
			return fmt.Errorf("not yet")
		}
		return nil
	})

	t.Run("1-2 reserved org and the service's client ID", func(t *testing.T) {
		// Attack 1: become the conversation service by claiming its identity. Refused at admission.
		err := create(t, ctx, k8s, w.squat, agentYAML("svc", "a2a-fleet", "system", "", "  agentID: conversation-service\n"))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "orgID a2a-fleet is reserved") {
			t.Errorf("claiming the reserved org: %v", err)
		}
		err = create(t, ctx, k8s, "", `apiVersion: a2a.fleet.dev/v1alpha1
kind: Tenant
metadata: {name: sec-reserved}
spec: {orgID: a2a-fleet, namespaces: [x]}
`)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("a Tenant for the reserved org: %v", err)
		}
		// Attack 2: take over the service's session with an agent's credentials and the
		// service's client ID. The broker ties every agent username to its own client ID.
		if c, err := dial(t, addr, "a2a:acme/sales/alpha", "a2a-fleet/system/conversation-service-0", ready(t, ctx, w.a, "alpha")); err == nil {
			c.Close()
			t.Error("an agent's credentials connected with the service's client ID")
		}
		if !mayPublish(t, ctx, svc, identity.DeliveryTopic(identity.Of(getAgent(t, ctx, w.a, "gated")))) {
			t.Error("the service lost its grants")
		}
		noKicks(t, "session takeover attempt", svc)
	})

	t.Run("the brokers' control APIs", func(t *testing.T) {
		// An agent must not administer the broker: neither dynsec's control topic nor the
		// decision table's (whose export holds every password hash) is open to it, for
		// sending or for reading the answers.
		for _, topic := range []string{"$CONTROL/dynamic-security/v1", "$CONTROL/a2a-fleet/v1"} {
			if mayPublish(t, ctx, alpha, topic) {
				t.Errorf("an agent may publish on %s", topic)
			}
			if maySubscribe(t, ctx, alpha, topic+"/response") {
				t.Errorf("an agent may subscribe to %s/response", topic)
			}
		}
		if maySubscribe(t, ctx, alpha, "$CONTROL/#") {
			t.Error("an agent may subscribe to $CONTROL/#")
		}
		noKicks(t, "control API probes", alpha, bystander, gated, svc)
	})

	t.Run("3 squatting an org from another namespace", func(t *testing.T) {
		// The squatter comes first: an older claim by a namespace that may not make it blocks
		// nobody.
		mustCreate(t, ctx, w.squat, agentYAML("victim", "acme", "sales", "", "  callers: {scope: SameOrg}\n"))
		sq := condition(t, ctx, w.squat, "victim", a2av1.ConditionIdentityPermitted, metav1.ConditionFalse, a2av1.ReasonIdentityNotPermitted, "org acme belongs to Tenant sec-acme")
		if c := findCond(sq, a2av1.ConditionReady); c.Reason != a2av1.ReasonIdentityNotPermitted || sq.Status.CredentialsSecret != "" {
			t.Errorf("squatter: Ready %+v, credentials %q", c, sq.Status.CredentialsSecret)
		}
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has one-second resolution
		mustCreate(t, ctx, w.a, agentYAML("victim", "acme", "sales", "", "  callers: {scope: SameUnit}\n"))
		victim := connectAgent(t, ctx, addr, "acme/sales/victim", ready(t, ctx, w.a, "victim"))
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.squat, Name: "victim-mqtt-credentials"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("the squatter has a credentials Secret (err %v)", err)
		}
		// The squatter's claimed scope (SameOrg) does not reach the broker: only the holder's.
		if mayPublish(t, ctx, victim, "$a2a/v1/reply/acme/support/x/1") {
			t.Error("the squatter's SameOrg scope reached the victim's ACLs")
		}
		// A Tenant's unit restriction.
		mustCreate(t, ctx, w.b, agentYAML("spender", "globex", "finance", "", ""))
		condition(t, ctx, w.b, "spender", a2av1.ConditionIdentityPermitted, metav1.ConditionFalse, a2av1.ReasonIdentityNotPermitted, "allows units audit, ops, not finance")
		if w.onBroker(t, ctx, "globex/finance/spender") {
			t.Error("an identity outside the Tenant's units is on the broker")
		}
		noKicks(t, "squatting", alpha, bystander, svc)
	})

	t.Run("4 gated agents reply only through the service", func(t *testing.T) {
		if mayPublish(t, ctx, gated, "$a2a/v1/reply/acme/sales/alpha/r1") {
			t.Error("a gated agent may reply to its caller directly")
		}
		if !mayPublish(t, ctx, gated, identity.ServiceReplyFilter()[:len(identity.ServiceReplyFilter())-1]+"r1") {
			t.Error("a gated agent may not reply to the service")
		}
		if mayPublish(t, ctx, alpha, "$a2a/v1/delivery/acme/sales/gated") {
			t.Error("a caller may bypass the service")
		}
		if maySubscribe(t, ctx, gated, "$a2a/v1/request/acme/sales/gated") {
			t.Error("a gated agent may read its public request topic")
		}
	})

	t.Run("5 no collateral disconnects", func(t *testing.T) {
		newcomer := "$a2a/v1/request/acme/sales/newcomer"
		mustCreate(t, ctx, w.a, agentYAML("newcomer", "acme", "sales", "", "  callers: {scope: SameUnit}\n"))
		ready(t, ctx, w.a, "newcomer")
		eventuallyPublish(t, ctx, bystander, newcomer, true)
		patch(t, ctx, w.a, "newcomer", `{"spec":{"callers":{"scope":"None"}}}`)
		eventuallyPublish(t, ctx, bystander, newcomer, false)
		patch(t, ctx, w.a, "newcomer", `{"spec":{"callers":{"scope":"SameOrg"}}}`)
		eventuallyPublish(t, ctx, bystander, newcomer, true)
		// Gate it (a label joins the policy), then ungate it.
		patch(t, ctx, w.a, "newcomer", `{"metadata":{"labels":{"conversations":"governed"}}}`)
		eventually(t, "service reads newcomer's requests", func() error {
			if !maySubscribe(t, ctx, svc, newcomer) {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		patch(t, ctx, w.a, "newcomer", `{"metadata":{"labels":{"conversations":null}}}`)
		eventually(t, "service no longer reads newcomer's requests", func() error {
			if maySubscribe(t, ctx, svc, newcomer) {
				return fmt.Errorf("still")
			}
			return nil
		})
		// A second policy appears and goes.
		mustCreate(t, ctx, w.a, agentYAML("target", "acme", "sales", "{app: target}", "  callers: {scope: SameUnit}\n"))
		ready(t, ctx, w.a, "target")
		mustCreate(t, ctx, w.a, `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: target-only}
spec: {agentSelector: {matchLabels: {app: target}}, priority: 5}
`)
		eventually(t, "target gated by the new policy", func() error {
			if !maySubscribe(t, ctx, svc, "$a2a/v1/request/acme/sales/target") {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		if err := k8s.Delete(ctx, &a2av1.ConversationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: w.a, Name: "target-only"}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "target ungated", func() error {
			if maySubscribe(t, ctx, svc, "$a2a/v1/request/acme/sales/target") {
				return fmt.Errorf("still gated")
			}
			return nil
		})
		if err := k8s.Delete(ctx, getAgent(t, ctx, w.a, "newcomer")); err != nil {
			t.Fatal(err)
		}
		eventuallyPublish(t, ctx, bystander, newcomer, false)
		noKicks(t, "creating, changing, gating, ungating and deleting other Agents and policies", alpha, bystander, gated, svc)
	})

	t.Run("6 cross-namespace callers need consent", func(t *testing.T) {
		mustCreate(t, ctx, w.b, agentYAML("grabber", "globex", "audit", "",
			"  callers: {scope: None, from: [{agentSelector: {}, namespaceSelector: {}}]}\n"))
		grabber := connectAgent(t, ctx, addr, "globex/audit/grabber", ready(t, ctx, w.b, "grabber"))
		condition(t, ctx, w.b, "grabber", a2av1.ConditionACLsSynced, metav1.ConditionTrue, a2av1.ReasonACLsApplied, "agents selected in namespaces "+w.a)
		if mayPublish(t, ctx, grabber, "$a2a/v1/reply/acme/sales/alpha/r1") {
			t.Error("a selector without consent grants replies into another namespace's agent")
		}
		if mayPublish(t, ctx, alpha, "$a2a/v1/request/globex/audit/grabber") {
			t.Error("a selector without consent admits another namespace's agent as caller")
		}
		// A grant in the wrong namespace (the selector's own) consents for nobody else.
		mustCreate(t, ctx, w.b, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: AgentGrant
metadata: {name: self-serve}
spec: {from: [{namespace: %s}], to: [{kind: Callers}]}
`, w.a))
		// The right namespace consents, for alpha only.
		mustCreate(t, ctx, w.a, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: AgentGrant
metadata: {name: globex-may-select-alpha}
spec: {from: [{namespace: %s}], to: [{kind: Callers, agentSelector: {matchLabels: {app: alpha}}}]}
`, w.b))
		eventuallyPublish(t, ctx, grabber, "$a2a/v1/reply/acme/sales/alpha/r1", true)
		eventuallyPublish(t, ctx, alpha, "$a2a/v1/request/globex/audit/grabber", true)
		if mayPublish(t, ctx, grabber, "$a2a/v1/reply/acme/sales/bystander/r1") || mayPublish(t, ctx, bystander, "$a2a/v1/request/globex/audit/grabber") {
			t.Error("the grant's agentSelector was not honoured")
		}
		if err := k8s.Delete(ctx, &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Namespace: w.a, Name: "globex-may-select-alpha"}}); err != nil {
			t.Fatal(err)
		}
		eventuallyPublish(t, ctx, grabber, "$a2a/v1/reply/acme/sales/alpha/r1", false)
		eventuallyPublish(t, ctx, alpha, "$a2a/v1/request/globex/audit/grabber", false)
		noKicks(t, "granting and revoking consent", alpha, bystander, svc)
	})

	t.Run("pools across namespaces need consent", func(t *testing.T) {
		mustCreate(t, ctx, w.a, agentYAML("worker-1", "acme", "sales", "", "  poolID: workers\n"))
		ready(t, ctx, w.a, "worker-1")
		time.Sleep(1100 * time.Millisecond) // the pool belongs to its oldest member's namespace
		mustCreate(t, ctx, w.a2, agentYAML("worker-2", "acme", "sales", "", "  poolID: workers\n"))
		w2 := condition(t, ctx, w.a2, "worker-2", a2av1.ConditionACLsSynced, metav1.ConditionFalse, a2av1.ReasonPoolNotGranted, "belongs to namespace "+w.a)
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.a2, Name: w2.Status.CredentialsSecret}, s); err != nil {
			t.Fatal(err)
		}
		worker2 := connectAgent(t, ctx, addr, "acme/sales/worker-2", string(s.Data["password"]))
		pool := "$share/a2a.acme.sales.workers/$a2a/v1/request/acme/sales/pool/workers"
		if maySubscribe(t, ctx, worker2, pool) {
			t.Error("an ungranted namespace joined another namespace's pool")
		}
		mustCreate(t, ctx, w.a, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: AgentGrant
metadata: {name: a2-may-join-workers}
spec: {from: [{namespace: %s}], to: [{kind: Pools, poolID: workers}]}
`, w.a2))
		ready(t, ctx, w.a2, "worker-2")
		if !maySubscribe(t, ctx, worker2, pool) {
			t.Error("a granted namespace cannot join the pool")
		}
	})

	t.Run("7 deleting the loser of an identity conflict", func(t *testing.T) {
		mustCreate(t, ctx, w.a, agentYAML("dup", "acme", "sales", "", "  callers: {scope: SameUnit}\n"))
		password := ready(t, ctx, w.a, "dup")
		winner := connectAgent(t, ctx, addr, "acme/sales/dup", password)
		time.Sleep(1100 * time.Millisecond)
		mustCreate(t, ctx, w.a2, agentYAML("dup", "acme", "sales", "", "  callers: {scope: SameOrg}\n"))
		condition(t, ctx, w.a2, "dup", a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonIdentityConflict, "already belongs to Agent "+w.a+"/dup")
		if err := k8s.Delete(ctx, getAgent(t, ctx, w.a2, "dup")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "loser gone", func() error {
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.a2, Name: "dup"}, &a2av1.Agent{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (err %v)", err)
			}
			return nil
		})
		if !w.onBroker(t, ctx, "acme/sales/dup") {
			t.Fatal("deleting the loser removed the winner's client and role")
		}
		if !mayPublish(t, ctx, winner, "$a2a/v1/discovery/acme/sales/dup") || !maySubscribe(t, ctx, winner, "$a2a/v1/request/acme/sales/dup") {
			t.Error("the winner lost its grants")
		}
		if card, ok := readRetained(t, ctx, bystander, "$a2a/v1/discovery/acme/sales/dup"); !ok {
			t.Error("the winner's retained card was cleared")
		} else if !strings.Contains(card, `"name":"dup"`) {
			t.Errorf("card = %s", card)
		}
		noKicks(t, "deleting the loser", winner, bystander, svc)
	})

	t.Run("tenant change removes the broker state", func(t *testing.T) {
		mustCreate(t, ctx, w.a2, agentYAML("mover", "acme", "ops", "", ""))
		mover := connectAgent(t, ctx, addr, "acme/ops/mover", ready(t, ctx, w.a2, "mover"))
		tn := &a2av1.Tenant{}
		if err := k8s.Get(ctx, types.NamespacedName{Name: "sec-acme"}, tn); err != nil {
			t.Fatal(err)
		}
		tn.Spec.Namespaces = []string{w.a}
		if err := k8s.Update(ctx, tn); err != nil {
			t.Fatal(err)
		}
		condition(t, ctx, w.a2, "mover", a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonIdentityNotPermitted, "org acme belongs to Tenant sec-acme")
		eventually(t, "mover's broker state and Secret removed", func() error {
			if w.onBroker(t, ctx, "acme/ops/mover") {
				return fmt.Errorf("still on the broker")
			}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.a2, Name: "mover-mqtt-credentials"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("secret still there (err %v)", err)
			}
			return nil
		})
		if len(mover.Kicks()) == 0 {
			t.Error("the agent whose identity was withdrawn is still connected")
		}
		noKicks(t, "withdrawing another namespace", alpha, bystander, svc)
	})
}

func findCond(a *a2av1.Agent, t string) metav1.Condition {
	for _, c := range a.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return metav1.Condition{}
}

func patch(t *testing.T, ctx context.Context, ns, name, merge string) {
	t.Helper()
	if err := k8s.Patch(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, []byte(merge))); err != nil {
		t.Fatalf("patch %s: %v", name, err)
	}
}

// readRetained reads the retained message on topic through a fresh subscription of c.
func readRetained(t *testing.T, ctx context.Context, c *mqttClient, topic string) (string, bool) {
	t.Helper()
	got := make(chan string, 1)
	c.Paho().AddOnPublishReceived(func(pr paho.PublishReceived) (bool, error) {
		if pr.Packet.Topic == topic && len(pr.Packet.Payload) > 0 {
			select {
			case got <- string(pr.Packet.Payload):
			default:
			}
		}
		return true, nil
	})
	if !maySubscribe(t, ctx, c, topic) {
		t.Fatalf("%s cannot subscribe to %s", c.Name(), topic)
	}
	select {
	case p := <-got:
		return p, true
	case <-time.After(5 * time.Second):
		return "", false
	}
}
