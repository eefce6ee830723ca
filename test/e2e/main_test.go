// Package e2e runs every seed flow end to end: the operator (in process,
// gating on) against a real control plane, a real broker with enforced ACLs
// (Mosquitto with dynsec, and the embedded broker), the conversation
// service, SDK agents and a plain-paho agent, and a requester using the
// generated credentials. The control plane is envtest (KUBEBUILDER_ASSETS)
// or, with E2E_USE_EXISTING_CLUSTER=1, the cluster in KUBECONFIG (kind).
package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/controlplane"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

var (
	cp      *testenv.ControlPlane
	restCfg *rest.Config
	k8s     client.Client
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel + 1)))
	// kube-controller-manager with the Deployment and ReplicaSet controllers: workloads roll for
	// real (TestRotationUnderLoadWithAWorkload runs their pods).
	kcm := testenv.Options{ControllerManager: true,
		Controllers: append(slices.Clone(controlplane.DefaultControllers), "deployment-controller", "replicaset-controller")}
	testenv.MainWith(m, filepath.Join("..", ".."), kcm, func(c *testenv.ControlPlane) error {
		cp, restCfg, k8s = c, c.Config, c.Client
		return nil
	})
}

// clock is the service's injected clock: tests move it forward to expire
// contexts and time out input-required tasks without waiting.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// Test agents. All in org acme, unit sales; the client may call all of
// them. "memory", "confirm" (SDK, through a thin bridge), "raw" and "story" (plain
// paho; "story" answers SendMessage with a stream of events) are governed by policy "governed"; "guarded" (plain paho) by
// "guarded" (maxConcurrentTasksPerContext 1); "direct" (plain paho) is not
// gated (benchmark baseline).
const org, unit = "acme", "sales"

type agentSpec struct {
	name, role string
}

var fleet = []agentSpec{
	{"client", ""},
	{"memory", "gated"},
	{"confirm", "gated"},
	{"raw", "gated"},
	{"story", "gated"},
	{"guarded", "guarded"},
	{"direct", ""},
}

func ref(name string) a2amqtt.AgentRef { return a2amqtt.AgentRef{Org: org, Unit: unit, Agent: name} }

// onBothBrokers runs a test on Mosquitto with dynsec and on the embedded
// broker, as subtests named after the broker.
func onBothBrokers(t *testing.T, test func(t *testing.T, kind string)) {
	for _, kind := range []string{"mosquitto", "embedded"} {
		t.Run(kind, func(t *testing.T) { test(t, kind) })
	}
}

// stack is one operator + broker + credentials; the service is started
// separately (in process or as a subprocess).
type stack struct {
	ns        string
	brokerURL string
	addr      string
	backend   acl.Backend
	mosquitto *brokertest.Mosquitto
	passwords map[string]string
	usernames map[string]string
	svcUser   string
	svcPass   string
}

func newStack(t testing.TB, ctx context.Context, kind string) *stack {
	t.Helper()
	st := &stack{passwords: map[string]string{}, usernames: map[string]string{}}
	switch kind {
	case "mosquitto":
		broker := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
		user, pass := broker.DynSecAdmin()
		ds, err := dynsec.Connect(ctx, dynsec.Config{URL: broker.URL(), Username: user, Password: pass})
		if err != nil {
			t.Fatalf("connect dynsec: %v", err)
		}
		t.Cleanup(func() { _ = ds.Close(context.Background()) })
		st.backend, st.brokerURL, st.addr, st.mosquitto = ds, broker.URL(), broker.Addr(), broker
	case "table":
		// The shipped broker: Mosquitto with the decision-table plugin.
		broker := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{MaxPacketSize: 1 << 20, Table: &brokertest.TableOptions{}})
		user, pass := broker.TableAdmin()
		tb, err := mosqtable.Connect(ctx, mosqtable.Config{URL: broker.URL(), Username: user, Password: pass})
		if err != nil {
			t.Fatalf("connect the decision table: %v", err)
		}
		t.Cleanup(func() { _ = tb.Close(context.Background()) })
		st.backend, st.brokerURL, st.addr, st.mosquitto = tb, broker.URL(), broker.Addr(), broker
	case "embedded":
		srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatalf("start embedded broker: %v", err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		st.backend, st.brokerURL, st.addr = srv.Backend(), srv.URL(), srv.Addr()
	default:
		t.Fatalf("unknown broker kind %q", kind)
	}
	st.ns = startOperator(t, ctx, st.backend, st.brokerURL)
	secretKey := client.ObjectKey{Namespace: st.ns, Name: "conversation-service-credentials"}
	if err := registration.EnsureServiceCredentials(ctx, k8s, st.backend, secretKey); err != nil {
		t.Fatalf("service credentials: %v", err)
	}
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, secretKey, s); err != nil {
		t.Fatal(err)
	}
	st.svcUser, st.svcPass = string(s.Data["username"]), string(s.Data["password"])
	apply(t, ctx, st.ns, `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed}
spec:
  agentSelector: {matchLabels: {role: gated}}
`)
	apply(t, ctx, st.ns, `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: guarded}
spec:
  agentSelector: {matchLabels: {role: guarded}}
  maxConcurrentTasksPerContext: 1
`)
	for _, a := range fleet {
		labels := "{}"
		if a.role != "" {
			labels = "{role: " + a.role + "}"
		}
		apply(t, ctx, st.ns, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s, labels: %s}
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: e2e agent}
  callers: {scope: SameUnit}
`, a.name, labels, org, unit, a.name))
	}
	eventually(t, 60*time.Second, "agents Ready (gated ones with a delivery topic)", func() error {
		for _, a := range fleet {
			ag := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: a.name}, ag); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(ag.Status.Conditions, a2av1.ConditionReady) {
				return fmt.Errorf("%s not ready: %v", a.name, ag.Status.Conditions)
			}
			if gated := ag.Status.Topics != nil && ag.Status.Topics.Delivery != ""; gated != (a.role != "") {
				return fmt.Errorf("%s: delivery topic %+v", a.name, ag.Status.Topics)
			}
			sec := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: ag.Status.CredentialsSecret}, sec); err != nil {
				return err
			}
			st.passwords[a.name] = string(sec.Data["password"])
			st.usernames[a.name] = string(sec.Data["username"])
		}
		return nil
	})
	return st
}

func apply(t testing.TB, ctx context.Context, ns, manifest string) {
	t.Helper()
	testenv.MustCreate(t, ctx, k8s, ns, manifest)
}

// startOperator runs the controllers with gating on, scoped to a fresh
// namespace (registration_test.go's pattern).
func startOperator(t testing.TB, ctx context.Context, backend acl.Backend, brokerURL string) string {
	t.Helper()
	return cp.StartOperator(t, ctx, "e2e-", backend, brokerURL, controllers.Options{Gating: true})
}

func eventually(t testing.TB, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	testenv.Eventually(t, timeout, what, fn)
}

// requester connects the client agent with its generated credentials.
func (st *stack) requester(t testing.TB, ctx context.Context) *a2amqtt.Requester {
	t.Helper()
	return st.requesterAs(t, ctx, "client")
}

// requesterAs connects the fleet's agent name as a requester with its generated credentials.
func (st *stack) requesterAs(t testing.TB, ctx context.Context, name string) *a2amqtt.Requester {
	t.Helper()
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: st.brokerURL, Username: st.usernames[name], Password: st.passwords[name], Agent: ref(name)})
	if err != nil {
		t.Fatalf("requester connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	r, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 10 * time.Second, MaxAttempts: 1}})
	if err != nil {
		t.Fatalf("requester: %v", err)
	}
	return r
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

type logrLogger = logr.Logger

// unstructuredPolicy patches a ConversationPolicy.
type unstructuredPolicy struct{ name, ns string }

func (p *unstructuredPolicy) patch(t testing.TB, ctx context.Context, merge string) {
	t.Helper()
	obj := &a2av1.ConversationPolicy{}
	obj.Name, obj.Namespace = p.name, p.ns
	if err := k8s.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(merge))); err != nil {
		t.Fatalf("patch policy %s: %v", p.name, err)
	}
}
