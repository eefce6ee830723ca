package registration_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

var (
	cp  *testenv.ControlPlane
	k8s client.Client
)

func TestMain(m *testing.M) {
	// Errors only: reconcile errors during outage tests are expected and asserted on.
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel + 1)))
	if conf := os.Getenv(fleetOperatorEnv); conf != "" {
		// The fleet benchmark's operator process (fleetoperator_test.go), not a test run.
		if err := runFleetOperator(conf); err != nil {
			fmt.Fprintln(os.Stderr, "fleet operator process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Main(m, filepath.Join("..", ".."), func(c *testenv.ControlPlane) error {
		cp, k8s = c, c.Client
		return nil
	})
}

// fleet is the test fleet: 7 agents of two tenants in two namespaces (acme, globex) and a squatter
// namespace that no Tenant binds, 3 orgs, 4 units, every caller rule kind, and a cross-namespace
// selector that one namespace consents to (AgentGrant) and another does not.
var fleet = []struct {
	name, ns, org, unit string // ns: the tenant key of the namespace ("squat": the unbound one)
	labels              map[string]string
	callers             string // YAML of spec.callers
}{
	{"planner", "acme", "acme", "sales", nil, "{scope: SameUnit}"},
	{"writer", "acme", "acme", "sales", nil, "{scope: None, from: [{agentSelector: {matchLabels: {role: auditor}}, namespaceSelector: {}}]}"},
	{"helpdesk", "acme", "acme", "support", map[string]string{"role": "auditor"}, "{scope: SameOrg}"},
	{"bot", "acme", "acme", "support", nil, "{scope: None}"},
	{"auditor", "globex", "globex", "audit", map[string]string{"role": "auditor"}, "{scope: None}"},
	{"reporter", "globex", "globex", "audit", nil, "{scope: SameUnit, from: [{agentSelector: {matchLabels: {role: auditor}}}]}"},
	// A namespace no Tenant binds may be the org named like itself (org "" here: filled in).
	{"lurker", "squat", "", "x", map[string]string{"role": "auditor"}, "{scope: SameOrg}"},
}

// squatters are Agents of the unbound namespace that claim the tenants' orgs: refused, nothing on
// the broker.
var squatters = []struct{ name, org, unit string }{
	{"impostor", "acme", "sales"},
	{"service", "globex", "audit"},
}

// fleetEnv is where the fleet lives: namespaces by tenant key, and each agent's resolved org.
type fleetEnv struct {
	ns   map[string]string
	orgs []string
}

func (e *fleetEnv) clientID(i int) string {
	return e.orgs[i] + "/" + fleet[i].unit + "/" + fleet[i].name
}
func (e *fleetEnv) nsOf(i int) string { return e.ns[fleet[i].ns] }

// mayCall is the rule the broker must enforce: the callee's scope covers the caller, or one of its
// selectors picks the caller where the caller's namespace consents.
func (e *fleetEnv) mayCall(caller, callee int) bool {
	c, x := fleet[caller], fleet[callee]
	switch {
	case strings.Contains(x.callers, "SameUnit") && e.orgs[caller] == e.orgs[callee] && c.unit == x.unit:
		return true
	case strings.Contains(x.callers, "SameOrg") && e.orgs[caller] == e.orgs[callee]:
		return true
	case strings.Contains(x.callers, "role: auditor") && c.labels["role"] == "auditor":
		if strings.Contains(x.callers, "namespaceSelector") {
			// writer: its own namespace, and globex, whose grant consents; not the squatter's.
			return c.ns == x.ns || c.ns == "globex"
		}
		return c.ns == x.ns
	}
	return false
}

func TestACLMatrixOnMosquittoDynsec(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	broker := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	user, pass := broker.DynSecAdmin()
	backend, err := dynsec.Connect(ctx, dynsec.Config{URL: broker.URL(), Username: user, Password: pass})
	if err != nil {
		t.Fatalf("connect dynsec backend: %v", err)
	}
	t.Cleanup(func() { _ = backend.Close(context.Background()) })
	checkFleetOnBroker(t, ctx, backend, broker.URL(), broker.Addr())
}

// TestACLMatrixOnMosquittoTable runs the same fleet and matrix against Mosquitto 2.0.11 with the
// project's decision-table plugin (internal/mqtt/mosqtable): the operator's acl.Policy deciding
// inside the shipped broker.
func TestACLMatrixOnMosquittoTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := testenv.StartBroker(t, ctx, testenv.TableKind)
	checkFleetOnBroker(t, ctx, b.Backend, b.URL, b.Addr)
}

// TestACLMatrixOnEmbeddedBroker runs the same fleet and matrix against the embedded mochi broker
// that local runs use: same identities, same decisions.
func TestACLMatrixOnEmbeddedBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0", MaxPacketSize: 1 << 20})
	if err != nil {
		t.Fatalf("start embedded broker: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	checkFleetOnBroker(t, ctx, srv.Backend(), srv.URL(), srv.Addr())
}

// checkFleetOnBroker applies the fleet through the operator and checks every broker decision the
// caller rules imply, the card, credentials, rotation and deletion.
func checkFleetOnBroker(t *testing.T, ctx context.Context, backend acl.Backend, brokerURL, brokerAddr string) {
	env := startFleetOperator(t, ctx, backend, brokerURL, controllers.Options{})
	creds := env.applyFleet(t, ctx)
	clientID := env.clientID
	env.checkSquatters(t, ctx, backend)

	clients := make([]*brokertest.Client, len(fleet))
	conns := make([]*paho.Client, len(fleet))
	for i := range fleet {
		clients[i] = testenv.DialAgent(t, brokerAddr, clientID(i), creds[i])
		conns[i] = clients[i].Paho()
	}
	checked := 0
	for c := range fleet {
		for x := range fleet {
			want := env.mayCall(c, x)
			request := "$a2a/v1/request/" + clientID(x)
			if got := mayPublish(t, ctx, conns[c], request); got != want {
				t.Errorf("%s publish to %s: allowed=%v, want %v", clientID(c), request, got, want)
			}
			// Replies flow back only to admitted callers.
			reply := "$a2a/v1/reply/" + clientID(c) + "/s1"
			if got := mayPublish(t, ctx, conns[x], reply); got != want {
				t.Errorf("%s publish reply to %s: allowed=%v, want %v", clientID(x), reply, got, want)
			}
			// Only the agent itself reads its requests and replies.
			for _, topic := range []string{request, "$a2a/v1/reply/" + clientID(x) + "/#"} {
				if got := maySubscribe(t, ctx, conns[c], topic); got != (c == x) {
					t.Errorf("%s subscribe %s: allowed=%v, want %v", clientID(c), topic, got, c == x)
				}
			}
			// Cards are visible within the org and to admitted callers.
			discovery := "$a2a/v1/discovery/" + clientID(x)
			wantCard := env.orgs[c] == env.orgs[x] || want
			if got := maySubscribe(t, ctx, conns[c], discovery); got != wantCard {
				t.Errorf("%s subscribe %s: allowed=%v, want %v", clientID(c), discovery, got, wantCard)
			}
			checked += 5
		}
		// Nobody may impersonate another agent's card or subscribe to everything.
		if got := mayPublish(t, ctx, conns[c], "$a2a/v1/discovery/"+clientID((c+1)%len(fleet))); got {
			t.Errorf("%s may publish another agent's card", clientID(c))
		}
		if got := maySubscribe(t, ctx, conns[c], "$a2a/v1/request/#"); got {
			t.Errorf("%s may subscribe to every request", clientID(c))
		}
		checked += 2
	}
	t.Logf("ACL matrix: %d agents in 3 namespaces (2 tenants, 1 unbound), %d broker decisions checked", len(fleet), checked)
	checkServiceAgrees(t, ctx, conns, clientID)

	// The retained card is the spec's, with the MQTT interface, marked as registered by the broker side.
	card, props := retainedCard(t, ctx, conns[0], "$a2a/v1/discovery/"+clientID(0))
	if card.Name != "planner" || len(card.SupportedInterfaces) != 1 || !strings.HasSuffix(card.SupportedInterfaces[0].URL, "$a2a/v1/request/acme/sales/planner") {
		t.Fatalf("card = %+v", card)
	}
	if props["a2a-status-source"] != "broker" {
		t.Fatalf("card user properties = %v", props)
	}

	// A wrong password and a foreign client ID are refused at CONNECT.
	if _, err := tryConnect(t, brokerAddr, clientID(0), "wrong"); err == nil {
		t.Fatal("wrong password accepted")
	}
	if _, err := tryConnectAs(t, brokerAddr, "a2a:"+clientID(0), "someone-else", creds[0]); err == nil {
		t.Fatal("credentials accepted with another client ID")
	}

	// Rotation: the old password stops working, the new one works.
	old := creds[1]
	ns := env.ns["acme"]
	updateAnnotation(t, ctx, ns, fleet[1].name, controllers.AnnotationRotateCredentials, "r1")
	eventually(t, "rotated password accepted by the broker", func() error {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fleet[1].name + "-mqtt-credentials"}, s); err != nil {
			return err
		}
		pw := string(s.Data["password"])
		if pw == old {
			return fmt.Errorf("not rotated yet")
		}
		c, err := tryConnect(t, brokerAddr, clientID(1), pw)
		if err != nil {
			return err
		}
		_ = c.Disconnect(&paho.Disconnect{})
		return nil
	})
	if _, err := tryConnect(t, brokerAddr, clientID(1), old); err == nil {
		t.Fatal("old password still accepted after rotation")
	}
	// From here on, no change to one Agent may disconnect another: count the disconnects of
	// every connected agent but writer (whose own password was rotated above).
	for i, c := range clients {
		if i != 1 {
			c.ResetKicks()
		}
	}

	// Relabelling a caller re-evaluates the selectors that admitted it: auditor loses its
	// role=auditor label, so writer (which admits role=auditor) stops admitting it, and back.
	writerRequest := "$a2a/v1/request/" + clientID(1)
	relabel := func(value string) {
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"role":%s}}}`, value)
		if err := k8s.Patch(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: env.ns["globex"], Name: "auditor"}}, client.RawPatch("application/merge-patch+json", patch)); err != nil {
			t.Fatalf("relabel auditor: %v", err)
		}
	}
	relabel("null")
	eventually(t, "caller dropped by the selector loses access", func() error {
		if allowed, err := publishVerdict(ctx, conns[4], writerRequest); err != nil || allowed {
			return fmt.Errorf("auditor may still call writer (err %v)", err)
		}
		return nil
	})
	relabel(`"auditor"`)
	eventually(t, "caller selected again regains access", func() error {
		if allowed, err := publishVerdict(ctx, conns[4], writerRequest); err != nil || !allowed {
			return fmt.Errorf("auditor may not call writer (err %v)", err)
		}
		return nil
	})

	// A card change is republished.
	patch := []byte(`{"spec":{"card":{"description":"plans the quarter"}}}`)
	if err := k8s.Patch(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planner"}}, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatalf("patch card: %v", err)
	}
	eventually(t, "updated card republished", func() error {
		card, _ := retainedCard(t, ctx, conns[0], "$a2a/v1/discovery/"+clientID(0))
		if card.Description != "plans the quarter" {
			return fmt.Errorf("card description %q", card.Description)
		}
		return nil
	})

	// A new SameOrg agent joins acme: creating it changes the org role only.
	newbie := `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: newbie}
spec: {orgID: acme, unitID: support, card: {name: newbie, description: test agent}, callers: {scope: SameOrg}}
`
	applyManifest(t, ctx, ns, newbie)
	eventually(t, "the org's agents may call the new SameOrg agent", func() error {
		if allowed, err := publishVerdict(ctx, conns[0], "$a2a/v1/request/acme/support/newbie"); err != nil || !allowed {
			return fmt.Errorf("planner may not call newbie (err %v)", err)
		}
		return nil
	})

	// Delete removes client, roles and card.
	botCard := "$a2a/v1/discovery/" + clientID(3)
	if _, ok := readRetained(t, ctx, conns[2], botCard, 5*time.Second); !ok {
		t.Fatal("bot has no card before deletion")
	}
	if err := k8s.Delete(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bot"}}); err != nil {
		t.Fatalf("delete agent: %v", err)
	}
	eventually(t, "bot's client and roles removed from the broker", func() error {
		st, err := backend.Observe(ctx, &acl.Names{Clients: []string{"a2a:acme/support/bot"}, Roles: []string{"a2a:agent:acme/support/bot"}})
		if err != nil {
			return err
		}
		if len(st.Clients)+len(st.Roles) != 0 {
			return fmt.Errorf("still present: %d clients, %d roles", len(st.Clients), len(st.Roles))
		}
		return nil
	})
	// Unregister removes the ACLs first, then clears the card.
	eventually(t, "deleted agent's card cleared", func() error {
		if p, ok := readRetained(t, ctx, conns[2], botCard, 500*time.Millisecond); ok {
			return fmt.Errorf("card still retained: %s", p.Payload)
		}
		return nil
	})
	if _, err := tryConnect(t, brokerAddr, clientID(3), creds[3]); err == nil {
		t.Fatal("deleted agent can still connect")
	}
	// Relabelling, rotating nobody else's password, creating and deleting Agents of the same unit
	// and org: no other client was disconnected.
	for i, c := range clients {
		if i == 1 || i == 3 {
			continue // writer's password was rotated; bot was deleted
		}
		if k := c.Kicks(); len(k) != 0 {
			t.Errorf("%s was disconnected %d times by changes to other Agents: %v", clientID(i), len(k), k)
		}
	}
}

// checkServiceAgrees holds the conversation service's caller admission (convservice.AdmitsCaller,
// the decision a replica makes for a gated agent, read through a cache like a replica's) against
// the broker pair by pair: the service admits a caller exactly when the broker lets it publish to
// the callee's request topic. The squatters' identities, which nobody holds, are admitted by
// no one.
func checkServiceAgrees(t *testing.T, ctx context.Context, conns []*paho.Client, clientID func(int) string) {
	t.Helper()
	reader := serviceCache(t, ctx)
	callers := make([]a2amqtt.AgentRef, 0, len(fleet)+len(squatters))
	for i := range fleet {
		ref, _ := a2amqtt.ParseAgentRef(clientID(i))
		callers = append(callers, ref)
	}
	for _, s := range squatters {
		callers = append(callers, a2amqtt.AgentRef{Org: s.org, Unit: s.unit, Agent: s.name})
	}
	pairs := 0
	eventually(t, "the service admits exactly the callers the broker lets through", func() error {
		var wrong []string
		pairs = 0
		for x := range fleet {
			callee, _ := a2amqtt.ParseAgentRef(clientID(x))
			for c, caller := range callers {
				brokerAllows := false
				if c < len(fleet) {
					var err error
					if brokerAllows, err = publishVerdict(ctx, conns[c], callee.RequestTopic()); err != nil {
						return err
					}
				}
				admitted, err := convservice.AdmitsCaller(ctx, reader, callee, caller)
				if err != nil {
					return err
				}
				if admitted != brokerAllows {
					wrong = append(wrong, fmt.Sprintf("%s -> %s: service %v, broker %v", caller, callee, admitted, brokerAllows))
				}
				pairs++
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d of %d pairs disagree: %s", len(wrong), pairs, strings.Join(wrong, "; "))
		}
		return nil
	})
	t.Logf("ACL matrix: the conversation service's admission agrees with the broker on %d caller/callee pairs", pairs)
}

// graphReader is a reader that carries a caller graph, as a replica's registry reads through
// one (tenancy.CallerGraphReader).
type graphReader struct {
	client.Reader
	graph *tenancy.CallerGraph
}

func (r graphReader) CallerGraph() *tenancy.CallerGraph { return r.graph }

// serviceCache is a cache of the objects a conversation service replica reads, with its indexes
// and its caller graph.
func serviceCache(t *testing.T, ctx context.Context) client.Reader {
	t.Helper()
	c, err := cache.New(cp.Config, cache.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := tenancy.IndexFields(ctx, c); err != nil {
		t.Fatal(err)
	}
	graph := tenancy.NewCallerGraph()
	if err := graph.Watch(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&a2av1.Agent{}, &a2av1.Tenant{}, &a2av1.AgentGrant{}, &corev1.Namespace{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { _ = c.Start(cctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("service cache did not sync")
	}
	eventually(t, "the service's caller graph synced", func() error {
		if !graph.Synced() {
			return errors.New("not synced")
		}
		return nil
	})
	return graphReader{Reader: c, graph: graph}
}

// TestBrokerOutageAndDriftRepair: a role deleted by hand comes back within one resync; a broker
// outage shows in the Agent's conditions and heals by itself when the broker returns.
func TestBrokerOutageAndDriftRepair(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	broker := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	user, pass := broker.DynSecAdmin()
	backend, err := dynsec.Connect(ctx, dynsec.Config{URL: broker.URL(), Username: user, Password: pass, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatalf("connect dynsec backend: %v", err)
	}
	t.Cleanup(func() { _ = backend.Close(context.Background()) })
	env := startFleetOperator(t, ctx, backend, broker.URL(), controllers.Options{ResyncPeriod: time.Second})
	passwords := env.applyFleet(t, ctx)
	clientID, ns := env.clientID, env.nsOf(0)

	role := "a2a:agent:" + clientID(0)
	if err := backend.Execute(ctx, []acl.Command{{Op: acl.OpDeleteRole, Role: role}}); err != nil {
		t.Fatalf("delete role by hand: %v", err)
	}
	eventually(t, "hand-deleted role restored", func() error {
		st, err := backend.Observe(ctx, &acl.Names{Roles: []string{role}})
		if err != nil {
			return err
		}
		if _, ok := st.Roles[role]; !ok {
			return fmt.Errorf("role %s still missing", role)
		}
		return nil
	})

	// A connected agent's own "online" card survives resyncs: the operator republishes only a
	// changed card.
	self := connect(t, ctx, broker.Addr(), clientID(0), passwords[0])
	online := &paho.Publish{Topic: "$a2a/v1/discovery/" + clientID(0), QoS: 1, Retain: true, Payload: []byte(`{"name":"planner"}`),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "a2a-status", Value: "online"}, {Key: "a2a-status-source", Value: "agent"}}}}
	if _, err := self.Publish(ctx, online); err != nil {
		t.Fatalf("publish own card: %v", err)
	}
	time.Sleep(3 * time.Second) // several 1 s resyncs
	if _, props := retainedCard(t, ctx, self, online.Topic); props["a2a-status-source"] != "agent" {
		t.Fatalf("a resync overwrote the agent's own card: %v", props)
	}

	broker.Stop()
	readyIs := func(want metav1.ConditionStatus, reason string) func() error {
		return func() error {
			a := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fleet[0].name}, a); err != nil {
				return err
			}
			c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionReady)
			if c == nil || c.Status != want || c.Reason != reason {
				return fmt.Errorf("Ready = %+v", c)
			}
			return nil
		}
	}
	eventually(t, "outage reported", readyIs(metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable))
	if err := broker.Restart(); err != nil {
		t.Fatalf("restart broker: %v", err)
	}
	eventually(t, "recovered after the outage", readyIs(metav1.ConditionTrue, a2av1.ReasonReconciled))
	c := connect(t, ctx, broker.Addr(), clientID(0), passwords[0])
	if !mayPublish(t, ctx, c, "$a2a/v1/discovery/"+clientID(0)) {
		t.Fatal("agent lost its ACLs across the outage")
	}
}

// TestGatedAgentsOnlyReachableThroughTheService: with a ConversationPolicy, callers still publish
// to the public request topic, but only the conversation service reads it and only the service
// may write the agent's delivery topic; a direct publish that tries to bypass it is refused.
func TestGatedAgentsOnlyReachableThroughTheService(t *testing.T) {
	for _, kind := range append(slices.Clone(testenv.BrokerKinds), testenv.TableKind) {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			b := testenv.StartBroker(t, ctx, kind)
			checkGating(t, ctx, b.Backend, b.URL, b.Addr)
		})
	}
}

func checkGating(t *testing.T, ctx context.Context, backend acl.Backend, brokerURL, brokerAddr string) {
	env := startFleetOperator(t, ctx, backend, brokerURL, controllers.Options{Gating: true})
	clientID, ns := env.clientID, env.ns["acme"]
	secretKey := client.ObjectKey{Namespace: ns, Name: "conversation-service-credentials"}
	if err := registration.EnsureServiceCredentials(ctx, k8s, backend, secretKey); err != nil {
		t.Fatalf("service credentials: %v", err)
	}
	policy := `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed}
spec:
  agentSelector: {matchLabels: {role: auditor}}
`
	applyManifest(t, ctx, ns, policy)
	creds := env.applyFleet(t, ctx)
	// helpdesk (index 2) is governed (label role=auditor) and admits all of acme (SameOrg).
	const gated, caller, stranger = 2, 0, 4
	eventually(t, "delivery topic in status", func() error {
		a := &a2av1.Agent{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fleet[gated].name}, a); err != nil {
			return err
		}
		if a.Status.Topics == nil || a.Status.Topics.Delivery != "$a2a/v1/delivery/"+clientID(gated) {
			return fmt.Errorf("topics = %+v", a.Status.Topics)
		}
		return nil
	})
	// The agent's ACLs flip once its policy is seen; wait for its role to lose the public topic.
	agent := connect(t, ctx, brokerAddr, clientID(gated), creds[gated])
	request := "$a2a/v1/request/" + clientID(gated)
	delivery := "$a2a/v1/delivery/" + clientID(gated)
	eventually(t, "gated agent reads only its delivery topic", func() error {
		if maySubscribe(t, ctx, agent, request) {
			return fmt.Errorf("agent may still read its public request topic")
		}
		if !maySubscribe(t, ctx, agent, delivery) {
			return fmt.Errorf("agent may not read its delivery topic")
		}
		return nil
	})
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, secretKey, s); err != nil {
		t.Fatal(err)
	}
	svc, err := tryConnectAs(t, brokerAddr, string(s.Data["username"]), "a2a-fleet/system/conversation-service-0", string(s.Data["password"]))
	if err != nil {
		t.Fatalf("service cannot connect with its credentials: %v", err)
	}
	t.Cleanup(func() { _ = svc.Disconnect(&paho.Disconnect{}) })
	callerConn := connect(t, ctx, brokerAddr, clientID(caller), creds[caller])
	strangerConn := connect(t, ctx, brokerAddr, clientID(stranger), creds[stranger])
	checks := []struct {
		what string
		got  bool
		want bool
	}{
		{"service reads the public request topic", maySubscribe(t, ctx, svc, request), true},
		{"service reads the public request topic (shared)", maySubscribe(t, ctx, svc, "$share/a2a-conversation/"+request), true},
		{"service writes the delivery topic", mayPublish(t, ctx, svc, delivery), true},
		{"service relays replies to the caller", mayPublish(t, ctx, svc, "$a2a/v1/reply/"+clientID(caller)+"/x"), true},
		{"admitted caller publishes to the public topic", mayPublish(t, ctx, callerConn, request), true},
		{"admitted caller bypasses the service via delivery", mayPublish(t, ctx, callerConn, delivery), false},
		{"stranger bypasses the service via delivery", mayPublish(t, ctx, strangerConn, delivery), false},
		{"agent writes its own delivery topic", mayPublish(t, ctx, agent, delivery), false},
		{"agent replies to the service", mayPublish(t, ctx, agent, "$a2a/v1/reply/a2a-fleet/system/conversation-service/r1"), true},
		{"agent queries the service's history", mayPublish(t, ctx, agent, "$a2a/v1/request/a2a-fleet/system/conversation-service"), true},
		{"ungated agent still reads its own request topic", maySubscribe(t, ctx, callerConn, "$a2a/v1/request/"+clientID(caller)), true},
		{"service reads an ungated agent's requests", maySubscribe(t, ctx, svc, "$a2a/v1/request/"+clientID(caller)), false},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: allowed=%v, want %v", c.what, c.got, c.want)
		}
	}
}

// startFleetOperator runs the operator over the fleet's three namespaces: acme and globex, each
// bound to its org by a Tenant, and an unbound one; globex consents (AgentGrant) that acme's
// Agents select its auditors as callers.
func startFleetOperator(t testing.TB, ctx context.Context, backend acl.Backend, brokerURL string, opts controllers.Options) *fleetEnv {
	t.Helper()
	env := &fleetEnv{ns: map[string]string{}}
	for _, key := range []string{"acme", "globex", "squat"} {
		ns := cp.NewNamespace(t, ctx, "reg-"+key+"-")
		if key != "squat" {
			cp.BindNamespace(t, ctx, ns, key)
		}
		env.ns[key] = ns
	}
	for _, a := range fleet {
		env.orgs = append(env.orgs, cmp.Or(a.org, env.ns[a.ns]))
	}
	applyManifest(t, ctx, env.ns["globex"], fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: AgentGrant
metadata: {name: acme-may-select-auditors}
spec:
  from: [{namespace: %s}]
  to: [{kind: Callers, agentSelector: {matchLabels: {role: auditor}}}]
`, env.ns["acme"]))
	cp.StartOperatorWith(t, ctx, testenv.Operator{Namespaces: env.ns,
		Broker: registration.BrokerConfig{URL: brokerURL, Backend: backend}, Controllers: opts})
	return env
}

func applyManifest(t testing.TB, ctx context.Context, ns, manifest string) {
	t.Helper()
	testenv.MustCreate(t, ctx, k8s, ns, manifest)
}

// applyFleet creates the fleet and the squatters, waits for every fleet Agent to be Ready and
// returns their passwords.
func (e *fleetEnv) applyFleet(t *testing.T, ctx context.Context) []string {
	t.Helper()
	for i, a := range fleet {
		var labels string
		for k, v := range a.labels {
			labels += fmt.Sprintf("\n    %s: %s", k, v)
		}
		manifest := fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: %s
  labels: {}%s
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: test agent}
  callers: %s
`, a.name, labels, e.orgs[i], a.unit, a.name, a.callers)
		if labels != "" {
			manifest = strings.Replace(manifest, "labels: {}", "labels:", 1)
		}
		applyManifest(t, ctx, e.nsOf(i), manifest)
	}
	for _, s := range squatters {
		applyManifest(t, ctx, e.ns["squat"], fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s, labels: {role: auditor}}
spec: {orgID: %s, unitID: %s, card: {name: %s, description: squatter}, callers: {scope: SameOrg}}
`, s.name, s.org, s.unit, s.name))
	}
	passwords := make([]string, len(fleet))
	eventually(t, "all agents Ready", func() error {
		for i, a := range fleet {
			ag := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: e.nsOf(i), Name: a.name}, ag); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(ag.Status.Conditions, a2av1.ConditionReady) {
				return fmt.Errorf("%s not ready: %v", a.name, ag.Status.Conditions)
			}
			s := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: e.nsOf(i), Name: ag.Status.CredentialsSecret}, s); err != nil {
				return err
			}
			passwords[i] = string(s.Data["password"])
		}
		return nil
	})
	return passwords
}

// checkSquatters: the unbound namespace's claims on the tenants' orgs are refused with
// IdentityNotPermitted naming the Tenant, get no Secret and leave nothing on the broker.
func (e *fleetEnv) checkSquatters(t *testing.T, ctx context.Context, backend acl.Backend) {
	t.Helper()
	for _, s := range squatters {
		eventually(t, "squatter refused", func() error {
			a := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: e.ns["squat"], Name: s.name}, a); err != nil {
				return err
			}
			c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionIdentityPermitted)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != a2av1.ReasonIdentityNotPermitted ||
				!strings.Contains(c.Message, "belongs to Tenant testenv-"+e.ns[s.org]) {
				return fmt.Errorf("%s: IdentityPermitted = %+v", s.name, c)
			}
			if a.Status.CredentialsSecret != "" {
				return fmt.Errorf("%s got credentials %s", s.name, a.Status.CredentialsSecret)
			}
			return nil
		})
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: e.ns["squat"], Name: s.name + "-mqtt-credentials"}, &corev1.Secret{}); err == nil {
			t.Errorf("squatter %s has a credentials Secret", s.name)
		}
		username := "a2a:" + s.org + "/" + s.unit + "/" + s.name
		st, err := backend.Observe(ctx, &acl.Names{Clients: []string{username}, Roles: []string{"a2a:agent:" + s.org + "/" + s.unit + "/" + s.name}})
		if err != nil {
			t.Fatalf("observe: %v", err)
		}
		if len(st.Clients)+len(st.Roles) != 0 {
			t.Errorf("squatter %s is on the broker: %+v", s.name, st)
		}
	}
}

func updateAnnotation(t *testing.T, ctx context.Context, ns, name, key, value string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, key, value)
	if err := k8s.Patch(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatalf("annotate %s: %v", name, err)
	}
}

func tryConnect(t testing.TB, addr, clientID, password string) (*paho.Client, error) {
	return tryConnectAs(t, addr, "a2a:"+clientID, clientID, password)
}

// tryConnectAs connects with an explicit username, to try a client ID the username does not own.
func tryConnectAs(t testing.TB, addr, username, clientID, password string) (*paho.Client, error) {
	t.Helper()
	c, err := brokertest.Dial(t, addr, brokertest.Options{Username: username, ClientID: clientID, Password: password, IgnoreMessages: true})
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", clientID, err)
	}
	return c.Paho(), nil
}

func connect(t *testing.T, ctx context.Context, addr, clientID, password string) *paho.Client {
	t.Helper()
	c, err := tryConnect(t, addr, clientID, password)
	if err != nil {
		t.Fatalf("agent %s cannot connect with its generated credentials: %v", clientID, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}

// mayPublish sends a QoS 1 publish and reads the broker's verdict from the PUBACK.
func mayPublish(t *testing.T, ctx context.Context, c *paho.Client, topic string) bool {
	t.Helper()
	allowed, err := publishVerdict(ctx, c, topic)
	if err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
	return allowed
}

// publishVerdict is mayPublish for callers that retry: an ACL change kicks the session, so a
// publish can fail without a verdict.
func publishVerdict(ctx context.Context, c *paho.Client, topic string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(`{}`)})
	if resp != nil {
		return resp.ReasonCode < 0x80, nil
	}
	return err == nil, err
}

// maySubscribe subscribes and reads the verdict from the SUBACK, then unsubscribes.
func maySubscribe(t *testing.T, ctx context.Context, c *paho.Client, filter string) bool {
	t.Helper()
	ack, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if ack == nil || len(ack.Reasons) != 1 {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	if ack.Reasons[0] >= 0x80 {
		return false
	}
	_, _ = c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}})
	return true
}

// readRetained subscribes c to topic and returns the retained message, if one arrives in wait.
func readRetained(t *testing.T, ctx context.Context, c *paho.Client, topic string, wait time.Duration) (*paho.Publish, bool) {
	t.Helper()
	got := make(chan *paho.Publish, 1)
	c.AddOnPublishReceived(func(pr paho.PublishReceived) (bool, error) {
		// An empty retained publish is a deletion, not a message.
		if pr.Packet.Topic == topic && len(pr.Packet.Payload) > 0 {
			select {
			case got <- pr.Packet:
			default:
			}
		}
		return true, nil
	})
	if !maySubscribe(t, ctx, c, topic) {
		t.Fatalf("cannot subscribe to %s", topic)
	}
	select {
	case p := <-got:
		return p, true
	case <-time.After(wait):
		return nil, false
	}
}

// retainedCard reads the retained card on topic through a fresh subscription of c.
func retainedCard(t *testing.T, ctx context.Context, c *paho.Client, topic string) (a2a.AgentCard, map[string]string) {
	t.Helper()
	p, ok := readRetained(t, ctx, c, topic, 5*time.Second)
	if !ok {
		t.Fatalf("no retained card on %s", topic)
	}
	var card a2a.AgentCard
	if err := json.Unmarshal(p.Payload, &card); err != nil {
		t.Fatalf("card JSON: %v", err)
	}
	props := map[string]string{}
	for _, u := range p.Properties.User {
		props[u.Key] = u.Value
	}
	return card, props
}

func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, check)
}
