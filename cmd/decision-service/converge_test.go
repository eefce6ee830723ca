package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	testenv.Main(m, "../..", func(c *testenv.ControlPlane) error { cp = c; return nil })
}

// operatorOnly are the objects only the operator's own broker connection needs (its identity,
// its state sentinel): the decision service admits the operator as its configured admin instead.
func operatorOnly(name string) bool {
	return name == identity.OperatorRoleName || name == identity.SentinelRoleName || strings.HasPrefix(name, identity.OperatorRoleName)
}

func withoutOperator(st acl.State) acl.State {
	out := st.Clone()
	for n := range out.Roles {
		if operatorOnly(n) {
			delete(out.Roles, n)
		}
	}
	for n := range out.Clients {
		if operatorOnly(n) {
			delete(out.Clients, n)
		}
	}
	return out
}

// sameTable reports how two tables differ ("" when they hold the same objects).
func sameTable(a, b acl.State) string {
	var diffs []string
	for _, kind := range []struct {
		name string
		a, b any
	}{{"roles", a.Roles, b.Roles}, {"groups", a.Groups, b.Groups}, {"clients", a.Clients, b.Clients}} {
		if !reflect.DeepEqual(kind.a, kind.b) {
			diffs = append(diffs, fmt.Sprintf("%s: operator %v\n  decision service %v", kind.name, kind.a, kind.b))
		}
	}
	return strings.Join(diffs, "\n")
}

// TestReplicaConvergesToTheOperatorsTable: the operator registers a small fleet (scopes None,
// SameUnit, SameOrg, a callers.from selector) on its embedded broker; two decision-service
// replicas started beside it, reading only Kubernetes, hold the same table (the operator's own
// identity aside); one answers the Agents' Secrets' passwords over HTTP, refuses everything
// before its first pass, and follows a deletion after the other replica has stopped.
func TestReplicaConvergesToTheOperatorsTable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	broker, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = broker.Close() })
	ns := cp.StartOperator(t, ctx, "decision-", broker.Backend(), broker.URL(), controllers.Options{})

	// Two replicas, each with its own cache and table; the second is stopped half-way.
	s, err := newService(ctx, cp.Config, options{probeAddr: "0", metricsAddr: "0"}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.store.Close() })
	endpoint := httptest.NewServer(s.handler)
	t.Cleanup(endpoint.Close)
	ctx2, stop2 := context.WithCancel(ctx)
	s2, err := newService(ctx2, cp.Config, options{probeAddr: "0", metricsAddr: "0"}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.store.Close() })
	user := func(name string) string { return "a2a:acme/ops/" + name }
	goAuthUser := func(username, password, clientID string) int {
		t.Helper()
		body := fmt.Sprintf(`{"username":%q,"password":%q,"clientid":%q}`, username, password, clientID)
		resp, err := http.Post(endpoint.URL+"/mosquitto-go-auth/user", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := goAuthUser("anyone", "x", "c"); code != http.StatusServiceUnavailable {
		t.Fatalf("before the first pass: %d, want 503 (fail closed)", code)
	}

	for _, m := range []string{
		`{apiVersion: a2a.fleet.dev/v1alpha1, kind: Agent, metadata: {name: solo}, spec: {orgID: acme, unitID: ops, card: {name: solo, description: d}}}`,
		`{apiVersion: a2a.fleet.dev/v1alpha1, kind: Agent, metadata: {name: unit, labels: {role: worker}}, spec: {orgID: acme, unitID: ops, card: {name: unit, description: d}, callers: {scope: SameUnit}}}`,
		`{apiVersion: a2a.fleet.dev/v1alpha1, kind: Agent, metadata: {name: org}, spec: {orgID: acme, unitID: ops, card: {name: org, description: d}, callers: {scope: SameOrg}}}`,
		`{apiVersion: a2a.fleet.dev/v1alpha1, kind: Agent, metadata: {name: picky}, spec: {orgID: acme, unitID: ops, card: {name: picky, description: d}, callers: {from: [{agentSelector: {matchLabels: {role: worker}}}]}}}`,
	} {
		testenv.MustCreate(t, ctx, cp.Client, ns, m)
	}
	go func() { _ = s.mgr.Start(ctx) }()
	go func() { _ = s2.mgr.Start(ctx2) }()

	passwords := map[string]string{}
	testenv.Eventually(t, 60*time.Second, "the replica holds the operator's table", func() error {
		for _, name := range []string{"solo", "unit", "org", "picky"} {
			var sec corev1.Secret
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-mqtt-credentials"}, &sec); err != nil {
				return err
			}
			passwords[name] = string(sec.Data[identity.SecretKeyPassword])
			var a a2av1.Agent
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &a); err != nil {
				return err
			}
			if !metaReady(a) {
				return fmt.Errorf("agent %s not Ready yet", name)
			}
		}
		if !s.converger.Ready() {
			return fmt.Errorf("replica not ready")
		}
		op, err := broker.Backend().Observe(ctx, nil)
		if err != nil {
			return err
		}
		mine, err := s.store.Observe(ctx, nil)
		if err != nil {
			return err
		}
		if d := sameTable(withoutOperator(op), mine); d != "" {
			return fmt.Errorf("tables differ:\n%s", d)
		}
		other, err := s2.store.Observe(ctx, nil)
		if err != nil {
			return err
		}
		if d := sameTable(mine, other); d != "" {
			return fmt.Errorf("the replicas' tables differ:\n%s", d)
		}
		return nil
	})
	// One replica gone: the other answers alone, and goes on following changes.
	stop2()
	for name, pw := range passwords {
		if code := goAuthUser(user(name), pw, "acme/ops/"+name); code != http.StatusOK {
			t.Errorf("%s with its Secret's password: %d, want 200", name, code)
		}
		if code := goAuthUser(user(name), pw+"x", "acme/ops/"+name); code != http.StatusForbidden {
			t.Errorf("%s with a wrong password: %d, want 403", name, code)
		}
	}
	// Decisions over the same table: picky admits role=worker (unit) only.
	for _, c := range []struct {
		user, topic string
		want        bool
	}{
		{user("unit"), "$a2a/v1/request/acme/ops/picky", true},
		{user("solo"), "$a2a/v1/request/acme/ops/picky", false},
		{user("solo"), "$a2a/v1/request/acme/ops/org", true},
		{user("org"), "$a2a/v1/request/acme/ops/unit", true},
	} {
		if got := s.store.Allows(c.user, acl.Publish, c.topic); got != c.want {
			t.Errorf("%s publishes %s: %v, want %v", c.user, c.topic, got, c.want)
		}
		if d, err := broker.Backend().Check(ctx, c.user, acl.Publish, c.topic); err != nil || d.Allow != c.want {
			t.Errorf("operator's broker: %s publishes %s: %v (%v), want %v", c.user, c.topic, d.Allow, err, c.want)
		}
	}

	// A deleted Agent leaves the replica's table: its password no longer connects.
	if err := cp.Client.Delete(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "solo"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "solo gone from the replica", func() error {
		if code := goAuthUser(user("solo"), passwords["solo"], "acme/ops/solo"); code != http.StatusForbidden {
			return fmt.Errorf("solo still answered %d", code)
		}
		return nil
	})
	t.Logf("replica passes: %d", s.converger.passes.Load())
}

func metaReady(a a2av1.Agent) bool {
	for _, c := range a.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}
