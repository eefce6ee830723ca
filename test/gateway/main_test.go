// Package gateway tests the HTTP gateway (internal/gateway) end to end: the control plane
// (test/testenv: a real kube-apiserver, which issues and reviews ServiceAccount tokens), the
// operator with gating on, a real broker (Mosquitto with dynsec, and the embedded broker), the
// conversation service, MQTT agents (the SDK's responder), HTTP agents (a2a-go's JSON-RPC server)
// and HTTP callers (a2a-go's JSON-RPC client), all in process on loopback.
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

var (
	cp      *testenv.ControlPlane
	restCfg *rest.Config
	k8s     client.Client
	kube    kubernetes.Interface
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChildGateway())
	}
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel + 1)))
	// The JS SDK first (idempotent; a missing npm or registry fails the suite here, with the
	// script's message): TestJSClientCallsAnMQTTAgent runs its HTTP client.
	install := exec.Command("bash", filepath.Join("..", "..", "hack", "install-node-deps.sh"))
	install.Stdout, install.Stderr = os.Stderr, os.Stderr
	if err := install.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "gateway: hack/install-node-deps.sh failed: %v\n", err)
		os.Exit(1)
	}
	testenv.Main(m, filepath.Join("..", ".."), func(c *testenv.ControlPlane) error {
		cp, restCfg, k8s = c, c.Config, c.Client
		var err error
		kube, err = kubernetes.NewForConfig(restCfg)
		return err
	})
}

const org, unit = "acme", "sales"

// ref is the identity of fleet agent name.
func ref(name string) a2amqtt.AgentRef {
	for _, a := range fleet("") {
		if a.name == name {
			return a2amqtt.AgentRef{Org: org, Unit: a.unit, Agent: name}
		}
	}
	return a2amqtt.AgentRef{Org: org, Unit: unit, Agent: name}
}

// The fleet. "client" is an HTTP caller's identity (ServiceAccount "caller" acts as it);
// "mqttclient" calls from the bus (the baseline), "rawclient" too with a raw paho client (the
// benchmarks' like-for-like pair, rawclients_test.go); "memory" (governed) and "direct" (not governed)
// are MQTT agents exposed over HTTP; "httpagent" (governed) is an HTTP agent served by a2a-go's
// server that the gateway holds on the bus; "outsider" is in another unit, so the others'
// callers rules (SameUnit) do not admit it.
type agentSpec struct {
	name, unit, role, http string
}

func fleet(httpAgentURL string) []agentSpec {
	return []agentSpec{
		{"client", unit, "", "{serviceAccounts: [caller]}"},
		{"mqttclient", unit, "", ""},
		{"rawclient", unit, "", ""},
		{"memory", unit, "gated", "{expose: true}"},
		{"direct", unit, "", "{expose: true}"},
		{"httpagent", unit, "gated", fmt.Sprintf("{url: %q}", httpAgentURL)},
		{"outsider", "other", "", "{serviceAccounts: [outsider]}"},
	}
}

var gatedNames = []string{"acme/sales/httpagent", "acme/sales/memory"}

func onBothBrokers(t *testing.T, test func(t *testing.T, kind string)) {
	for _, kind := range []string{"mosquitto", "embedded"} {
		t.Run(kind, func(t *testing.T) { test(t, kind) })
	}
}

// stack is a broker, the operator, the conversation service and the fleet's credentials.
type stack struct {
	ns, brokerURL string
	backend       acl.Backend
	passwords     map[string]string
	usernames     map[string]string
	svc           *convservice.Service
	// wrap, when set, wraps the handler of the gateways made after it is set (a benchmark's
	// timestamps).
	wrap func(http.Handler) http.Handler
}

func newStack(t testing.TB, ctx context.Context, kind, httpAgentURL string, edit ...func(*convservice.Config)) *stack {
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
		st.backend, st.brokerURL = ds, broker.URL()
	case "embedded":
		srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatalf("start embedded broker: %v", err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		st.backend, st.brokerURL = srv.Backend(), srv.URL()
	}
	st.ns = cp.StartOperator(t, ctx, "gw-", st.backend, st.brokerURL, controllers.Options{Gating: true})
	secretKey := client.ObjectKey{Namespace: st.ns, Name: "conversation-service-credentials"}
	if err := registration.EnsureServiceCredentials(ctx, k8s, st.backend, secretKey); err != nil {
		t.Fatalf("service credentials: %v", err)
	}
	svcSecret := &corev1.Secret{}
	if err := k8s.Get(ctx, secretKey, svcSecret); err != nil {
		t.Fatal(err)
	}
	testenv.MustCreate(t, ctx, k8s, st.ns, `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed}
spec:
  agentSelector: {matchLabels: {role: gated}}
`)
	agents := fleet(httpAgentURL)
	for _, a := range agents {
		labels := "{}"
		if a.role != "" {
			labels = "{role: " + a.role + "}"
		}
		httpSpec := ""
		if a.http != "" {
			httpSpec = "\n  http: " + a.http
		}
		testenv.MustCreate(t, ctx, k8s, st.ns, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s, labels: %s}
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: gateway test agent, capabilities: {streaming: true}}
  callers: {scope: SameUnit}%s
`, a.name, labels, org, a.unit, a.name, httpSpec))
	}
	for _, sa := range []string{"caller", "outsider", "nobody"} {
		if err := k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: st.ns, Name: sa}}); err != nil {
			t.Fatalf("service account %s: %v", sa, err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "agents Ready", func() error {
		for _, a := range agents {
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
	cfg := convservice.Config{
		BrokerURL: st.brokerURL, Username: string(svcSecret.Data["username"]), Password: string(svcSecret.Data["password"]),
		ReplicaID: "gw", Store: "bolt:" + filepath.Join(t.TempDir(), "state.db"), BoltNoSync: true,
		RestConfig: restCfg, Namespace: st.ns, SweepInterval: 50 * time.Millisecond, ResyncInterval: 500 * time.Millisecond,
		StatsInterval: 200 * time.Millisecond, CallerRate: -1,
	}
	for _, e := range edit {
		e(&cfg)
	}
	svc, err := convservice.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start conversation service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	testenv.Eventually(t, 30*time.Second, "service consumes every gated agent", func() error {
		if got := svc.GatedAgents(); !slices.Equal(got, gatedNames) {
			return fmt.Errorf("gated agents %v, want %v", got, gatedNames)
		}
		return nil
	})
	st.svc = svc
	return st
}

// token asks the API server for a token of ServiceAccount name (TokenRequest), as a pod's
// projected token or `kubectl create token` would get one.
func (st *stack) token(t testing.TB, ctx context.Context, name string) string {
	t.Helper()
	tr, err := kube.CoreV1().ServiceAccounts(st.ns).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", name, err)
	}
	return tr.Status.Token
}

// gateway runs the gateway's two sides in process: its HTTP side on a loopback listener (the
// returned URL), its bus side holding the HTTP agents.
func (st *stack) gateway(t testing.TB, ctx context.Context) (string, *gateway.Pool) {
	t.Helper()
	r := st.gatewayReplica(t, ctx)
	return r.url, r.pool
}

// replica is one in-process gateway.
type replica struct {
	url  string
	pool *gateway.Pool
	out  *gateway.Outbound
	stop func()
}

// sweepIdle closes the pool's idle caller connections and returns how many it closed, waiting
// (up to 5 s) until want of them have been: a handler lets its connection go when it returns,
// just after it flushed the reply the test has already read.
func sweepIdle(ctx context.Context, pool *gateway.Pool, want int) int {
	deadline := time.Now().Add(5 * time.Second)
	swept := 0
	for {
		swept += pool.Sweep(ctx, 0)
		if swept >= want || time.Now().After(deadline) {
			return swept
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gatewayReplica is gateway with a stop function that ends the replica as a killed pod would:
// its HTTP connections cut, its MQTT connections closed.
func (st *stack) gatewayReplica(t testing.TB, ctx context.Context) *replica {
	t.Helper()
	reader, err := gateway.NewCachedReader(ctx, restCfg, st.ns)
	if err != nil {
		t.Fatalf("gateway reader: %v", err)
	}
	dir := &gateway.Directory{Reader: reader, Namespace: st.ns}
	conn := gateway.ConnConfig{BrokerURL: st.brokerURL, Logger: slog.New(slog.DiscardHandler),
		// A refused publish is not retried (the SDK retries a refused publish like a lost one).
		Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 10 * time.Second, MaxAttempts: 1}}
	pool := gateway.NewPool(conn, dir)
	in := gateway.NewInbound(gateway.InboundConfig{Directory: dir, Pool: pool, BrokerURL: st.brokerURL,
		Auth: &gateway.TokenReviewer{Reviews: kube.AuthenticationV1().TokenReviews()}, MaxBodyBytes: 64 << 10})
	var handler http.Handler = in
	if st.wrap != nil {
		handler = st.wrap(in)
	}
	srv := httptest.NewServer(handler)
	out := gateway.NewOutbound(gateway.OutboundConfig{Conn: conn, Directory: dir})
	stop := func() {
		srv.CloseClientConnections()
		srv.Close()
		out.Close(context.Background())
		pool.Close(context.Background())
	}
	t.Cleanup(stop)
	testenv.Eventually(t, 30*time.Second, "gateway holds the HTTP agents", func() error {
		if err := out.Sync(ctx); err != nil {
			return err
		}
		if held := out.Held(); len(held) != 1 {
			return fmt.Errorf("held %v", held)
		}
		return nil
	})
	return &replica{url: srv.URL, pool: pool, out: out, stop: stop}
}

// requesterAs connects a fleet agent as a requester with its credentials.
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
