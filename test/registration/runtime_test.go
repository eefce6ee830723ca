package registration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// runtimeBroker is a broker for the runtime tests, with an admin that may read anything.
type runtimeBroker struct {
	name, url, addr      string
	backend              acl.Backend
	adminUser, adminPass string
	mosquitto            *brokertest.Mosquitto
}

var quiet = slog.New(slog.DiscardHandler)

func runtimeMosquitto(t *testing.T) *runtimeBroker {
	t.Helper()
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	user, pass := m.DynSecAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	be, err := dynsec.Connect(ctx, dynsec.Config{URL: m.URL(), Username: user, Password: pass, Logger: quiet})
	if err != nil {
		t.Fatalf("connect dynsec: %v", err)
	}
	t.Cleanup(func() { _ = be.Close(context.Background()) })
	return &runtimeBroker{name: "mosquitto", url: m.URL(), addr: m.Addr(), backend: be, adminUser: user, adminPass: pass, mosquitto: m}
}

func runtimeTable(t *testing.T) *runtimeBroker {
	t.Helper()
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{Table: &brokertest.TableOptions{}})
	user, pass := m.TableAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	be, err := mosqtable.Connect(ctx, mosqtable.Config{URL: m.URL(), Username: user, Password: pass, Logger: quiet})
	if err != nil {
		t.Fatalf("connect decision table: %v", err)
	}
	t.Cleanup(func() { _ = be.Close(context.Background()) })
	return &runtimeBroker{name: "table", url: m.URL(), addr: m.Addr(), backend: be, adminUser: user, adminPass: pass, mosquitto: m}
}

func runtimeEmbedded(t *testing.T) *runtimeBroker {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0", Store: embedded.StoreConfig{AdminUsername: "admin", AdminPassword: "admin-pw"}})
	if err != nil {
		t.Fatalf("start embedded broker: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return &runtimeBroker{name: "embedded", url: srv.URL(), addr: srv.Addr(), backend: srv.Backend(), adminUser: "admin", adminPass: "admin-pw"}
}

func forRuntimeBrokers(t *testing.T, fn func(t *testing.T, b *runtimeBroker)) {
	t.Run("mosquitto", func(t *testing.T) { fn(t, runtimeMosquitto(t)) })
	t.Run("embedded", func(t *testing.T) { fn(t, runtimeEmbedded(t)) })
	t.Run("table", func(t *testing.T) { fn(t, runtimeTable(t)) })
}

// createAgents creates n plain Agents (scope None) named prefix-0..n-1.
func createAgents(t *testing.T, ctx context.Context, ns, prefix string, n int) []*a2av1.Agent {
	t.Helper()
	var out []*a2av1.Agent
	for i := range n {
		a := &a2av1.Agent{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", prefix, i)},
			Spec:       a2av1.AgentSpec{OrgID: "acme", UnitID: "rt", Card: a2av1.AgentCardSpec{Name: "rt", Description: "runtime test"}},
		}
		if err := k8s.Create(ctx, a); err != nil {
			t.Fatalf("create agent: %v", err)
		}
		out = append(out, a)
	}
	return out
}

func waitReady(t *testing.T, ctx context.Context, agents []*a2av1.Agent) {
	t.Helper()
	eventually(t, "agents Ready with a published card", func() error {
		for _, a := range agents {
			got := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(a), got); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(got.Status.Conditions, a2av1.ConditionReady) || got.Status.PublishedCardDigest == "" {
				return fmt.Errorf("%s not ready: %v", a.Name, got.Status.Conditions)
			}
		}
		return nil
	})
}

// retained reads the retained message on topic with a fresh subscription ("" when none
// arrives within 300 ms: retained messages come right after the SUBACK).
func retained(t *testing.T, b *runtimeBroker, topic string) (payload string, props map[string]string) {
	t.Helper()
	c := brokertest.MustDial(t, b.addr, brokertest.Options{Username: b.adminUser, Password: b.adminPass, ClientID: "reader-" + fmt.Sprint(time.Now().UnixNano())})
	defer c.Close()
	if code := c.Subscribe(topic); code >= 0x80 {
		t.Fatalf("%s: reader subscribe %s: %#x", b.name, topic, code)
	}
	p, err := c.Next(300 * time.Millisecond)
	if err != nil {
		return "", nil
	}
	props = map[string]string{}
	for _, u := range p.Properties.User {
		props[u.Key] = u.Value
	}
	return string(p.Payload), props
}

// Retained cards lost by a broker restart without persistence come back: the operator's card
// connection reconnects, finds the cards of registered Agents missing and republishes them,
// while an agent that is running and republishes its own online card within the grace keeps
// it (the operator never overwrites a card that is there).
func TestCardsRepublishedAfterBrokerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := runtimeMosquitto(t) // brokertest runs Mosquitto with persistence off: retained messages die with it
	op := cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "cards-",
		Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend, CardGrace: 5 * time.Second}})
	agents := createAgents(t, ctx, op.Namespace, "card", 3)
	waitReady(t, ctx, agents)
	running := identity.Of(agents[2])
	secret := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: op.Namespace, Name: identity.CredentialsSecretName(agents[2])}, secret); err != nil {
		t.Fatal(err)
	}
	online := func() *brokertest.Client {
		c := brokertest.MustDial(t, b.addr, brokertest.Options{Username: identity.Username(running), Password: string(secret.Data["password"]), ClientID: running.ClientID()})
		if _, err := c.PublishWith(&paho.Publish{Topic: running.DiscoveryTopic(), QoS: 1, Retain: true, Payload: []byte(`{"name":"online"}`),
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: a2amqtt.PropStatus, Value: "online"}, {Key: a2amqtt.PropStatusSource, Value: "agent"}}}}); err != nil {
			t.Fatalf("agent card: %v", err)
		}
		return c
	}
	agent := online()
	for _, a := range agents[:2] {
		if p, _ := retained(t, b, identity.Of(a).DiscoveryTopic()); p == "" {
			t.Fatalf("no registration card for %s before the restart", a.Name)
		}
	}

	if err := b.mosquitto.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if p, _ := retained(t, b, identity.Of(a).DiscoveryTopic()); p != "" {
			t.Fatalf("the restart kept the card of %s: the test needs a broker without persistence", a.Name)
		}
	}
	// The running agent reconnects and puts its own card back (the SDK does this at once).
	agent.Close()
	_ = online()

	eventually(t, "registration cards of the idle agents republished", func() error {
		for _, a := range agents[:2] {
			p, props := retained(t, b, identity.Of(a).DiscoveryTopic())
			if p == "" {
				return fmt.Errorf("%s: no card yet", a.Name)
			}
			if props[a2amqtt.PropStatus] != a2amqtt.StatusOffline || props[a2amqtt.PropStatusSource] != a2amqtt.SourceBroker {
				return fmt.Errorf("%s: card properties %v", a.Name, props)
			}
		}
		return nil
	})
	if p, props := retained(t, b, running.DiscoveryTopic()); p != `{"name":"online"}` || props[a2amqtt.PropStatusSource] != "agent" {
		t.Errorf("the running agent's own card was overwritten: %q %v", p, props)
	}
	if err := op.Broker.Healthy(time.Second); err != nil {
		t.Errorf("broker runtime unhealthy after the restart: %v", err)
	}
}

// A card cleared by hand (an empty retained message) on a registered Agent's topic comes back
// too, on the embedded broker as on Mosquitto.
func TestClearedCardRepublished(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		op := cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "clear-",
			Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend, CardGrace: 2 * time.Second}})
		agents := createAgents(t, ctx, op.Namespace, "clear", 1)
		waitReady(t, ctx, agents)
		id := identity.Of(agents[0])
		topic := id.DiscoveryTopic()
		secret := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: op.Namespace, Name: identity.CredentialsSecretName(agents[0])}, secret); err != nil {
			t.Fatal(err)
		}
		// The agent itself clears its card (the Mosquitto admin may not publish to normal topics).
		self := brokertest.MustDial(t, b.addr, brokertest.Options{Username: identity.Username(id), Password: string(secret.Data["password"]), ClientID: id.ClientID()})
		if pr, err := self.PublishWith(&paho.Publish{Topic: topic, QoS: 1, Retain: true}); err != nil || pr.ReasonCode >= 0x80 {
			t.Fatalf("clear card: %v %v", pr, err)
		}
		if p, _ := retained(t, b, topic); p != "" {
			t.Fatalf("card not cleared: %q", p)
		}
		eventually(t, "cleared card republished", func() error {
			if p, _ := retained(t, b, topic); p == "" {
				return errors.New("no card")
			}
			return nil
		})
	})
}

// The broker losing its identities is noticed within seconds (the state sentinel), not at the
// next resync: every Agent is sent on the resync stream, and the operator's and the
// conversation service's identities are re-created, with an Event on the service's Secret.
func TestBrokerStateLossDetected(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		svcNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "svc-"}}
		if err := k8s.Create(ctx, svcNS); err != nil {
			t.Fatal(err)
		}
		secretKey := client.ObjectKey{Namespace: svcNS.Name, Name: "service-credentials"}
		op := cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "loss-", NoControllers: true,
			Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend, ServiceSecret: &secretKey,
				SentinelInterval: 200 * time.Millisecond, CardGrace: 100 * time.Millisecond}})
		agents := createAgents(t, ctx, op.Namespace, "loss", 3)
		hasClient := func(user string) error {
			st, err := b.backend.Observe(ctx, &acl.Names{Clients: []string{user}, Roles: []string{identity.SentinelRoleName}})
			if err != nil {
				return err
			}
			if _, ok := st.Clients[user]; !ok {
				return fmt.Errorf("no broker client %s", user)
			}
			if _, ok := st.Roles[identity.SentinelRoleName]; !ok {
				return errors.New("no sentinel")
			}
			return nil
		}
		eventually(t, "identities in place", func() error {
			if err := hasClient(identity.ServiceUsername); err != nil {
				return err
			}
			if err := hasClient(identity.OperatorUsername); err != nil {
				return err
			}
			return op.Broker.Healthy(0)
		})
		if n, _ := op.Broker.StateLosses(); n != 0 {
			t.Fatalf("a fresh broker counted as a state loss (%d)", n)
		}

		// Lose everything the operator owns, sentinel included, as an empty restored broker would.
		all, err := b.backend.Observe(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		wipe := acl.Desired{Delete: acl.Names{Roles: keysOf(all.Roles), Groups: keysOf(all.Groups), Clients: keysOf(all.Clients)}}
		lost := time.Now()
		if _, err := acl.Apply(ctx, b.backend, wipe); err != nil {
			t.Fatal(err)
		}

		seen := map[string]bool{}
		deadline := time.After(30 * time.Second)
		for len(seen) < len(agents) {
			select {
			case ev := <-op.Broker.AgentResyncs():
				seen[ev.Object.GetNamespace()+"/"+ev.Object.GetName()] = true
			case <-deadline:
				t.Fatalf("%s: resync events for %d of %d agents after the loss", b.name, len(seen), len(agents))
			}
		}
		t.Logf("%s: state loss noticed and every Agent queued for resync in %s", b.name, time.Since(lost).Round(time.Millisecond))
		for _, a := range agents {
			if !seen[a.Namespace+"/"+a.Name] {
				t.Errorf("%s: no resync for %s", b.name, a.Name)
			}
		}
		if n, _ := op.Broker.StateLosses(); n != 1 {
			t.Errorf("%s: StateLosses = %d, want 1", b.name, n)
		}
		eventually(t, "operator and service identities re-created", func() error {
			if err := hasClient(identity.ServiceUsername); err != nil {
				return err
			}
			if err := hasClient(identity.OperatorUsername); err != nil {
				return err
			}
			return op.Broker.Healthy(0)
		})
		// The service can log in with the password its Secret holds.
		secret := &corev1.Secret{}
		if err := k8s.Get(ctx, secretKey, secret); err != nil {
			t.Fatal(err)
		}
		svc := brokertest.MustDial(t, b.addr, brokertest.Options{Username: identity.ServiceUsername, Password: string(secret.Data["password"]), ClientID: "svc-1"})
		svc.Close()
		eventually(t, "an Event on the service Secret says what was repaired", func() error {
			return findEvent(ctx, secretKey, registration.EventServiceIdentityRepaired)
		})
	})
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func findEvent(ctx context.Context, regarding client.ObjectKey, reason string) error {
	var list eventsv1.EventList
	if err := k8s.List(ctx, &list, client.InNamespace(regarding.Namespace)); err != nil {
		return err
	}
	var reasons []string
	for _, e := range list.Items {
		if e.Regarding.Name == regarding.Name && e.Reason == reason {
			return nil
		}
		reasons = append(reasons, e.Reason+": "+e.Note)
	}
	return fmt.Errorf("no %s event on %s; events: %s", reason, regarding, strings.Join(reasons, " | "))
}

// The service identity is reconciled like an Agent: a client deleted by hand is re-created at
// the next check, and a deleted Secret is written again with a new password that the broker
// is given (the old one stops working), each with an Event.
func TestServiceIdentityRepaired(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := runtimeEmbedded(t)
	svcNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "svc-"}}
	if err := k8s.Create(ctx, svcNS); err != nil {
		t.Fatal(err)
	}
	secretKey := client.ObjectKey{Namespace: svcNS.Name, Name: "service-credentials"}
	cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "svc-op-", NoControllers: true,
		Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend, ServiceSecret: &secretKey, ServiceResync: 300 * time.Millisecond}})
	password := func() string {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, secretKey, s); err != nil {
			return ""
		}
		return string(s.Data["password"])
	}
	login := func(pw string) error {
		c, err := brokertest.Dial(t, b.addr, brokertest.Options{Username: identity.ServiceUsername, Password: pw, ClientID: "svc-x"})
		if err == nil {
			c.Close()
		}
		return err
	}
	eventually(t, "service identity created", func() error { return login(password()) })

	if err := b.backend.Execute(ctx, []acl.Command{{Op: acl.OpDeleteClient, Username: identity.ServiceUsername}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleted service client re-created", func() error { return login(password()) })
	eventually(t, "repair Event", func() error { return findEvent(ctx, secretKey, registration.EventServiceIdentityRepaired) })

	old := password()
	if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Secret written again with a new password the broker accepts", func() error {
		pw := password()
		if pw == "" || pw == old {
			return errors.New("no new Secret yet")
		}
		return login(pw)
	})
	if err := login(old); err == nil {
		t.Error("the old password still works after the Secret was re-created")
	}
	eventually(t, "Event about the new credentials", func() error {
		return findEvent(ctx, secretKey, registration.EventServiceCredentialsNew)
	})
}

// staleGatesObserver answers the service identity's observation as if the gates role were still
// missing, while the broker already holds it filled: the window in which, after a broker state
// loss, the shared reconcile of the gates fills the role between the service identity's
// observation and its apply.
type staleGatesObserver struct {
	acl.Backend
	stale bool // the first observation only
}

func (s *staleGatesObserver) Observe(ctx context.Context, only *acl.Names) (acl.State, error) {
	st, err := s.Backend.Observe(ctx, only)
	if err == nil && !s.stale {
		s.stale = true
		delete(st.Roles, identity.GatesRoleName)
	}
	return st, err
}

// TestServiceIdentityLeavesTheGatesAlone: the service identity's repair never empties the gates
// role, even when it observed it missing and the shared reconcile filled it meanwhile (seen in the
// chaos suite: the service's request subscriptions were refused for a whole resync period).
func TestServiceIdentityLeavesTheGatesAlone(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		svcNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "svc-"}}
		if err := k8s.Create(ctx, svcNS); err != nil {
			t.Fatal(err)
		}
		gated := a2amqtt.AgentRef{Org: "acme", Unit: "rt", Agent: "gated"}
		filled := acl.Role{Name: identity.GatesRoleName, ACLs: []acl.ACL{{Type: acl.SubscribeLiteral, Topic: gated.RequestTopic(), Allow: true}}}
		if _, err := acl.Apply(ctx, b.backend, acl.Desired{State: acl.NewState([]acl.Role{filled}, nil, nil)}); err != nil {
			t.Fatal(err)
		}
		key := client.ObjectKey{Namespace: svcNS.Name, Name: "service-credentials"}
		rep, _, err := registration.EnsureServiceIdentity(ctx, k8s, &staleGatesObserver{Backend: b.backend}, key)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(rep.Commands, func(c acl.Command) bool { return c.Op == acl.OpCreateRole && c.Role == identity.GatesRoleName }) {
			t.Fatalf("the stale observation did not make the repair create the gates role, the test proves nothing: %v", rep.Commands)
		}
		only := acl.Names{Groups: []string{identity.ServiceGroupName}, Roles: []string{identity.GatesRoleName}}
		st, err := b.backend.Observe(ctx, &only)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Roles[identity.GatesRoleName].ACLs; !slices.Equal(acl.Canonical(got), acl.Canonical(filled.ACLs)) {
			t.Fatalf("%s: the service identity's repair rewrote the gates role: %v, want %v (commands %v)", b.name, got, filled.ACLs, rep.Commands)
		}
		if g := st.Groups[identity.ServiceGroupName]; !slices.Equal(g.Roles, []acl.RoleRef{{Name: identity.GatesRoleName}}) {
			t.Fatalf("%s: service group = %+v", b.name, g)
		}
	})
}

// The operator's broker connections belong to the manager: the operator starts while the broker
// is down (readiness fails after the grace, naming the cause), connects when it comes up,
// registers Agents, and publishes with any caller's context, cancelled or not afterwards.
func TestBrokerRuntimeOutlivesCallersAndOutages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	user, pass := m.DynSecAdmin()
	m.Stop()
	op := cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "life-",
		Broker: registration.BrokerConfig{URL: m.URL(), SentinelInterval: 200 * time.Millisecond},
		Admin:  &brokers.Config{Kind: brokers.Dynsec, Username: user, Password: pass, Logger: quiet}})
	agents := createAgents(t, ctx, op.Namespace, "life", 1)
	eventually(t, "readiness fails while the broker is down", func() error {
		err := op.Broker.Healthy(500 * time.Millisecond)
		if err == nil {
			return errors.New("still healthy")
		}
		if !strings.Contains(err.Error(), "dynsec admin") {
			return fmt.Errorf("readiness error does not name the admin connection: %v", err)
		}
		return nil
	})
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, agents)
	eventually(t, "readiness passes once connected", func() error { return op.Broker.Healthy(0) })

	short, stop := context.WithCancel(ctx)
	if err := op.Broker.PublishCard(short, "$a2a/v1/discovery/acme/rt/extra", []byte(`{}`), nil); err != nil {
		t.Fatalf("publish: %v", err)
	}
	stop()
	if err := op.Broker.PublishCard(ctx, "$a2a/v1/discovery/acme/rt/extra", nil, nil); err != nil {
		t.Fatalf("publish after the first caller's context ended: %v", err)
	}
}
