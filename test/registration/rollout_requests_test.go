package registration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestRolloutRequestsPerAgent counts the operator's requests to kube-apiserver (on its HTTP
// transport) while 50 new Agents become Ready without the finalizer policy (an install without
// config/admission, or with admission.agentFinalizer off): per Agent one Secret create, one
// finalizer update and about one status patch, and no read of a Secret from the API server (a
// new Agent's Secret cannot exist yet but for a foreign one, which its create finds). Counted,
// not timed: the rollout's cost is kube-apiserver's CPU per request (docs/benchmarks.md, "Where
// the time goes").
func TestRolloutRequestsPerAgent(t *testing.T) {
	checkRolloutRequests(t, false)
}

// TestRolloutRequestsPerAgentFinalizerAtAdmission is the same rollout with the shipped
// MutatingAdmissionPolicy (config/admission/agent-finalizer.yaml) adding the finalizer at
// CREATE: two writes per Agent (the Secret create and the status patch), no finalizer update,
// and still no Secret read (an Agent that has its finalizer at its first reconcile is new).
func TestRolloutRequestsPerAgentFinalizerAtAdmission(t *testing.T) {
	checkRolloutRequests(t, true)
}

func checkRolloutRequests(t *testing.T, finalizerAtAdmission bool) {
	const n = 50
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start embedded broker: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ns := map[string]string{}
	for _, org := range []string{"org0", "org1"} {
		ns[org] = cp.NewNamespace(t, ctx, "requests-")
		cp.BindNamespace(t, ctx, ns[org], org)
	}
	if finalizerAtAdmission {
		installFinalizerPolicy(t, ctx, ns)
	}
	cfg := rest.CopyConfig(cp.Config)
	counted := operatorClientConfig(cfg)
	cp.StartOperatorWith(t, ctx, testenv.Operator{Config: cfg, Namespaces: ns,
		Broker: registration.BrokerConfig{URL: srv.URL(), Backend: srv.Backend()}})
	writesBefore, readsBefore := counted.snapshot(), counted.snapshotReads()

	for i := range n {
		a := benchAgent(ns, i)
		if err := k8s.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
		if got := controllerutil.ContainsFinalizer(a, controllers.AgentFinalizer); got != finalizerAtAdmission {
			t.Fatalf("Agent %s created with the finalizer: %v, want %v (the policy)", a.Name, got, finalizerAtAdmission)
		}
	}
	testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d Agents Ready", n), func() error {
		ready := 0
		for _, namespace := range ns {
			var list a2av1.AgentList
			if err := k8s.List(ctx, &list, client.InNamespace(namespace)); err != nil {
				return err
			}
			for _, a := range list.Items {
				if meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) {
					ready++
				}
			}
		}
		if ready < n {
			return fmt.Errorf("%d of %d Ready", ready, n)
		}
		return nil
	})
	// Quiet: the operator writes nothing more for Agents that are Ready.
	writes, reads := delta(counted.snapshot(), writesBefore), delta(counted.snapshotReads(), readsBefore)
	t.Logf("operator requests for %d new Agents (finalizer at admission: %v): writes %v, reads %v", n, finalizerAtAdmission, writes, reads)

	// None on a first reconcile (the old code read one per Agent); a reconcile retried after a
	// failure part-way (a broker timeout on a loaded machine) reads its Secret, a few are tolerated.
	if got := reads["GET secrets"]; got > 5 {
		t.Errorf("the operator read %d Secrets from the API server for %d new Agents, want 0 (the cache, and the create, answer)", got, n)
	}
	// One each; a request retried after a failure (a conflict, a timeout on a loaded machine)
	// counts again, a few are tolerated.
	perAgent := []string{"POST secrets", "PUT agents"}
	if finalizerAtAdmission {
		perAgent = perAgent[:1]
		if got := writes["PUT agents"]; got != 0 {
			t.Errorf("PUT agents: %d for %d new Agents that had their finalizer at admission, want 0", got, n)
		}
	}
	for _, want := range perAgent {
		if got := writes[want]; got < n || got > n+5 {
			t.Errorf("%s: %d for %d new Agents, want one each", want, got, n)
		}
	}
	// A status patch per Agent, and one more for an Agent that waited for a shared role
	// (SharedACLsPending on the way to Ready).
	if got := writes["PATCH agents/status"]; got < n || got > 2*n {
		t.Errorf("PATCH agents/status: %d for %d new Agents, want %d to %d", got, n, n, 2*n)
	}
	for k := range writes {
		switch {
		case k == "POST secrets", k == "PATCH agents/status", k == "PUT agents" && !finalizerAtAdmission:
		case strings.Contains(k, "/tenants/") && strings.HasSuffix(k, "/status"):
			// The Tenants' status counts their Agents: paced, not per Agent.
		default:
			t.Errorf("other writes during the rollout: %v", writes)
		}
	}
}

// installFinalizerPolicy creates the shipped finalizer policy (config/admission/agent-finalizer.yaml)
// and its binding, the binding limited to namespaces (the control plane is shared by the
// package's tests, which count the operator's finalizer updates), and waits until the API server
// applies it (a new policy is compiled within a second or two). Both are deleted at the end.
func installFinalizerPolicy(t testing.TB, ctx context.Context, namespaces map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "admission", "agent-finalizer.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []any
	for _, n := range namespaces {
		names = append(names, n)
	}
	suffix := "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		if len(u.Object) == 0 {
			continue
		}
		u.SetName(u.GetName() + suffix)
		if u.GetKind() == "MutatingAdmissionPolicyBinding" {
			policy, _, _ := unstructured.NestedString(u.Object, "spec", "policyName")
			if err := unstructured.SetNestedField(u.Object, policy+suffix, "spec", "policyName"); err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedField(u.Object, map[string]any{"matchExpressions": []any{map[string]any{
				"key": corev1.LabelMetadataName, "operator": "In", "values": names,
			}}}, "spec", "matchResources", "namespaceSelector"); err != nil {
				t.Fatal(err)
			}
		}
		if err := k8s.Create(ctx, u); err != nil {
			t.Fatalf("create %s: %v", u.GetKind(), err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), u) })
	}
	for _, n := range namespaces {
		testenv.Eventually(t, 30*time.Second, "the finalizer policy applied in "+n, func() error {
			probe := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "policy-probe"},
				Spec: a2av1.AgentSpec{OrgID: "probe", UnitID: "probe", Card: a2av1.AgentCardSpec{Name: "probe", Description: "probe"}}}
			if err := k8s.Create(ctx, probe, client.DryRunAll); err != nil {
				return err
			}
			if !controllerutil.ContainsFinalizer(probe, controllers.AgentFinalizer) {
				return fmt.Errorf("a dry-run create has finalizers %v", probe.Finalizers)
			}
			return nil
		})
	}
}

// delta is after minus before, by key, without the keys that did not move.
func delta(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// TestAgentCreatedWithItsFinalizer: an Agent that has the operator's finalizer from its create
// (what the finalizer policy does at admission) is registered and Ready without the operator
// writing the Agent, and its deletion still removes its broker state (client, role) before the
// finalizer goes, on every broker backend.
func TestAgentCreatedWithItsFinalizer(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cfg := rest.CopyConfig(cp.Config)
		counted := operatorClientConfig(cfg)
		op := cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "finalizer-", Config: cfg,
			Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend}})
		agent := &a2av1.Agent{
			ObjectMeta: metav1.ObjectMeta{Namespace: op.Namespace, Name: "born-guarded", Finalizers: []string{controllers.AgentFinalizer}},
			Spec:       a2av1.AgentSpec{OrgID: "acme", UnitID: "rt", Card: a2av1.AgentCardSpec{Name: "rt", Description: "created with its finalizer"}},
		}
		if err := k8s.Create(ctx, agent); err != nil {
			t.Fatal(err)
		}
		waitReady(t, ctx, []*a2av1.Agent{agent})
		id := identity.Of(agent)
		names := &acl.Names{Clients: []string{identity.Username(id)}, Roles: []string{identity.AgentRoleName(id)}}
		st, err := b.backend.Observe(ctx, names)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Clients) != 1 || len(st.Roles) != 1 {
			t.Fatalf("%s: a Ready Agent has %d broker client(s) and %d role(s), want 1 and 1", b.name, len(st.Clients), len(st.Roles))
		}
		if got := counted.snapshot()["PUT agents"]; got != 0 {
			t.Errorf("%s: the operator updated the Agent %d time(s) on its way to Ready, want 0 (its finalizer was there)", b.name, got)
		}

		if err := k8s.Delete(ctx, agent); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the Agent gone", func() error {
			err := k8s.Get(ctx, client.ObjectKeyFromObject(agent), &a2av1.Agent{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (%v)", err)
		})
		st, err = b.backend.Observe(ctx, names)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Clients)+len(st.Roles) > 0 {
			t.Errorf("%s: after the deletion the broker still has %d client(s) and %d role(s) of the Agent", b.name, len(st.Clients), len(st.Roles))
		}
		// The finalizer's removal, the one write of the deletion the apiserver takes. A removal
		// it refuses because the informer lagged (409: the last status patch not yet seen, then
		// retried; 404: a reconcile queued before the Agent went) is counted apart.
		puts, refused := counted.snapshot()["PUT agents"], counted.snapshotRefused()["PUT agents"]
		if puts-refused != 1 {
			t.Errorf("%s: PUT agents %d over the Agent's life (%d refused: 409 or 404), want 1 accepted (the finalizer's removal)", b.name, puts, refused)
		}
		if refused > 0 {
			t.Logf("%s: %d removal(s) of the finalizer refused for a lagging informer", b.name, refused)
		}
	})
}

// TestFinalizerPolicyKeepsTheFinalizerThroughServerSideApply: a user who applies an Agent with
// server-side apply and applies it again (the same manifest, which does not name the finalizer)
// keeps the finalizer the policy added (the apply owns only the fields it names; the admission's
// addition is nobody's, so a later apply does not remove it). No operator runs here, so nothing
// else puts it back. And the finalizer can still be removed by hand once the Agent is deleted.
func TestFinalizerPolicyKeepsTheFinalizerThroughServerSideApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := cp.NewNamespace(t, ctx, "ssa-")
	installFinalizerPolicy(t, ctx, map[string]string{"ssa": ns})
	apply := func(description string) *a2av1.Agent {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": a2av1.GroupVersion.String(), "kind": "Agent",
			"metadata": map[string]any{"name": "applied", "namespace": ns},
			"spec": map[string]any{"orgID": "acme", "unitID": "ssa",
				"card": map[string]any{"name": "applied", "description": description}},
		}}
		if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("user"), client.ForceOwnership); err != nil {
			t.Fatalf("server-side apply: %v", err)
		}
		got := &a2av1.Agent{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "applied"}, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := apply("first"); !controllerutil.ContainsFinalizer(got, controllers.AgentFinalizer) {
		t.Fatalf("created by server-side apply: finalizers %v", got.Finalizers)
	}
	for _, d := range []string{"first", "second"} {
		if got := apply(d); !controllerutil.ContainsFinalizer(got, controllers.AgentFinalizer) {
			t.Fatalf("applied again (%s): finalizers %v, managed fields %v", d, got.Finalizers, got.ManagedFields)
		}
	}
	// The finalizer may still be removed by hand once the Agent is being deleted (an Agent stuck
	// without an operator): the policy acts at CREATE only.
	got := apply("second")
	if err := k8s.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(ctx, got, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatalf("remove the finalizer of an Agent under deletion: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, "the Agent gone once its finalizer was removed by hand", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(got), &a2av1.Agent{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}
