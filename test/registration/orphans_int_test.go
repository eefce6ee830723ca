package registration_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// An identity the broker knows but no Agent claims (left by an Agent deleted without its
// finalizer, or by a cluster restored from an older etcd backup) stops working: its client and
// role are deleted after two passes of the orphan search, its open connection ends, it can no
// longer log in and its retained card is cleared. The Agents that exist keep their connections
// and their objects, and nothing of the operator's own or the shared objects is touched.
func TestOrphanedIdentityRemoved(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		op := cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "orphan-",
			Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend, OrphanInterval: 300 * time.Millisecond}})
		agents := createAgents(t, ctx, op.Namespace, "live", 3)
		waitReady(t, ctx, agents)

		// The ghost: what a registered Agent of the same unit leaves on the broker.
		ghost := a2amqtt.AgentRef{Org: "acme", Unit: "rt", Agent: "ghost"}
		desired := registration.Compile(registration.Input{Agent: ghost})
		desired.Passwords = map[string]string{identity.Username(ghost): "ghost-pw"}
		desired.CreateRoles = nil
		if _, err := acl.Apply(ctx, b.backend, desired); err != nil {
			t.Fatalf("%s: create the ghost's objects: %v", b.name, err)
		}
		ghostConn := brokertest.MustDial(t, b.addr, brokertest.Options{Username: identity.Username(ghost), Password: "ghost-pw", ClientID: ghost.ClientID()})
		if pr, err := ghostConn.PublishWith(&paho.Publish{Topic: ghost.DiscoveryTopic(), QoS: 1, Retain: true, Payload: []byte(`{"name":"ghost"}`)}); err != nil || pr.ReasonCode >= 0x80 {
			t.Fatalf("%s: ghost card: %v %v", b.name, pr, err)
		}

		// Witnesses: every live Agent connected with its own credentials.
		watch := brokertest.NewWatch()
		for _, a := range agents {
			secret := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: op.Namespace, Name: identity.CredentialsSecretName(a)}, secret); err != nil {
				t.Fatal(err)
			}
			id := identity.Of(a)
			watch.Add(brokertest.MustDial(t, b.addr, brokertest.Options{Username: identity.Username(id), Password: string(secret.Data["password"]), ClientID: id.ClientID()}))
		}
		before, err := b.backend.Observe(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}

		start := time.Now()
		eventually(t, "the ghost's client and role deleted", func() error {
			st, err := b.backend.Observe(ctx, &acl.Names{Clients: []string{identity.Username(ghost)}, Roles: []string{identity.AgentRoleName(ghost)}})
			if err != nil {
				return err
			}
			if len(st.Clients)+len(st.Roles) > 0 {
				return fmt.Errorf("still there: %d client, %d role", len(st.Clients), len(st.Roles))
			}
			return nil
		})
		t.Logf("%s: orphaned identity deleted %s after its objects appeared (search every 300 ms, two passes)", b.name, time.Since(start).Round(10*time.Millisecond))
		if !ghostConn.Disconnected(5 * time.Second) {
			t.Errorf("%s: the ghost's open connection survived the deletion of its client", b.name)
		}
		var refused *brokertest.RefusedError
		if c, err := brokertest.Dial(t, b.addr, brokertest.Options{Username: identity.Username(ghost), Password: "ghost-pw", ClientID: ghost.ClientID()}); !errors.As(err, &refused) {
			if c != nil {
				c.Close()
			}
			t.Errorf("%s: the ghost can still log in (%v)", b.name, err)
		}
		eventually(t, "the ghost's card cleared", func() error {
			if p, _ := retained(t, b, ghost.DiscoveryTopic()); p != "" {
				return fmt.Errorf("card still retained: %q", p)
			}
			return nil
		})
		if n := op.Broker.OrphansDeleted(); n != 2 {
			t.Errorf("%s: OrphansDeleted = %d, want 2 (client and role)", b.name, n)
		}

		// Nothing else went: the live Agents' connections and every other object.
		if kicked := watch.Kicked(); len(kicked) > 0 {
			t.Errorf("%s: live agents disconnected: %v", b.name, kicked)
		}
		after, err := b.backend.Observe(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for name := range before.Clients {
			if _, ok := after.Clients[name]; !ok && name != identity.Username(ghost) {
				t.Errorf("%s: client %s deleted", b.name, name)
			}
		}
		for name := range before.Roles {
			if _, ok := after.Roles[name]; !ok && name != identity.AgentRoleName(ghost) {
				t.Errorf("%s: role %s deleted", b.name, name)
			}
		}
		for name := range before.Groups {
			if _, ok := after.Groups[name]; !ok {
				t.Errorf("%s: group %s deleted", b.name, name)
			}
		}
		if _, ok := after.Clients[identity.OperatorUsername]; !ok {
			t.Errorf("%s: the operator's client is missing", b.name)
		}
		if _, ok := after.Groups[identity.UnitGroupName("acme", "rt")]; !ok {
			t.Errorf("%s: the unit group is missing", b.name)
		}
	})
}

// The case the search exists for, end to end: an Agent deleted, its finalizer removed by hand,
// while the operator was down. The operator that starts next finds its client and role
// orphaned and deletes them (ending the connection the agent kept open meanwhile); the Agent
// that still exists keeps its connection and its objects.
func TestAgentDeletedWhileOperatorDownIsCollected(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ns := cp.NewNamespace(t, ctx, "down-")
		cp.BindNamespace(t, ctx, ns, "acme")
		o := testenv.Operator{Namespaces: map[string]string{"acme": ns}, Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend}}
		_, stop, err := cp.RunOperator(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		agents := createAgents(t, ctx, ns, "down", 2)
		waitReady(t, ctx, agents)
		dial := func(a *a2av1.Agent) *brokertest.Client {
			secret := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.CredentialsSecretName(a)}, secret); err != nil {
				t.Fatal(err)
			}
			id := identity.Of(a)
			return brokertest.MustDial(t, b.addr, brokertest.Options{Username: identity.Username(id), Password: string(secret.Data["password"]), ClientID: id.ClientID()})
		}
		gone, kept := dial(agents[0]), dial(agents[1])
		if err := stop(); err != nil {
			t.Fatalf("stop the operator: %v", err)
		}

		// Operator down: the Agent is deleted without its finalizer running.
		doomed := agents[0].DeepCopy()
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(doomed), doomed); err != nil {
			t.Fatal(err)
		}
		doomed.Finalizers = nil
		if err := k8s.Update(ctx, doomed); err != nil {
			t.Fatalf("remove the finalizer: %v", err)
		}
		if err := k8s.Delete(ctx, doomed); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the Agent gone from the API", func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(doomed), &a2av1.Agent{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
		gid := identity.Of(agents[0])
		if st, err := b.backend.Observe(ctx, &acl.Names{Clients: []string{identity.Username(gid)}}); err != nil || len(st.Clients) != 1 {
			t.Fatalf("%s: the deleted Agent's client should still be on the broker before the search: %v %v", b.name, st.Clients, err)
		}

		o.Broker.OrphanInterval = 300 * time.Millisecond
		run, stop2, err := cp.RunOperator(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = stop2() }()
		eventually(t, "the deleted Agent's client and role gone", func() error {
			st, err := b.backend.Observe(ctx, &acl.Names{Clients: []string{identity.Username(gid)}, Roles: []string{identity.AgentRoleName(gid)}})
			if err != nil {
				return err
			}
			if len(st.Clients)+len(st.Roles) > 0 {
				return fmt.Errorf("still there: %d client, %d role", len(st.Clients), len(st.Roles))
			}
			return nil
		})
		if !gone.Disconnected(5 * time.Second) {
			t.Errorf("%s: the deleted Agent's connection survived", b.name)
		}
		if kicked := brokertest.NewWatch(kept).Kicked(); len(kicked) > 0 {
			t.Errorf("%s: the remaining Agent was disconnected: %v", b.name, kicked)
		}
		kid := identity.Of(agents[1])
		st, err := b.backend.Observe(ctx, &acl.Names{Clients: []string{identity.Username(kid)}, Roles: []string{identity.AgentRoleName(kid)}})
		if err != nil || len(st.Clients) != 1 || len(st.Roles) != 1 {
			t.Errorf("%s: the remaining Agent's objects: %v %v (%v)", b.name, st.Clients, st.Roles, err)
		}
		// The collector counts a pass's deletions once the pass returns, which may be after the
		// objects are seen gone.
		eventually(t, "the collector counts its deletions", func() error {
			if n := run.Broker.OrphansDeleted(); n < 2 {
				return fmt.Errorf("OrphansDeleted = %d", n)
			}
			return nil
		})
		if n := run.Broker.OrphansDeleted(); n != 2 {
			t.Errorf("%s: OrphansDeleted = %d, want 2", b.name, n)
		}
	})
}
