package controllers_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"go.uber.org/zap/zapcore"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// brokeredNamespace is reconciled by a second manager that has a Registrar, so that the suite covers
// both the broker-less operator and the registration seam against one control plane.
const brokeredNamespace = "brokered"

var (
	scheme    *runtime.Scheme
	k8s       client.Client
	restCfg   *rest.Config
	registrar = newRecordingRegistrar()
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapcore.Level(zapLevel())), zap.StacktraceLevel(zapcore.PanicLevel)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testenv.MainWith(m, "..", testenv.Options{ControllerManager: true}, func(cp *testenv.ControlPlane) error {
		scheme, restCfg, k8s = cp.Scheme, cp.Config, cp.Client
		return startManagers(ctx)
	})
}

// suiteTenantLabel marks the namespaces the suite's Tenant binds to org acme, the org the tests'
// Agents claim.
const suiteTenantLabel = "a2a.fleet.dev/test-tenant"

// startManagers runs three managers: one without a broker for every namespace but
// brokeredNamespace and caNamespace, one with the recording Registrar for brokeredNamespace only,
// and one with a Registrar and a workload broker CA for caNamespace only (startCAManager).
func startManagers(ctx context.Context) error {
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: brokeredNamespace, Labels: map[string]string{suiteTenantLabel: "acme"}}}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	if err := k8s.Create(ctx, &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "suite-acme"}, Spec: a2av1.TenantSpec{
		OrgID: "acme", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{suiteTenantLabel: "acme"}},
	}}); err != nil {
		return fmt.Errorf("create tenant: %w", err)
	}
	plainCache := controllers.CacheOptions()
	plainCache.DefaultFieldSelector = fields.OneTermNotEqualSelector("metadata.namespace", brokeredNamespace)
	excludeCANamespace(&plainCache)
	// Cluster-scoped kinds have no metadata.namespace field to select on.
	for _, o := range []client.Object{&a2av1.Tenant{}, &corev1.Namespace{}} {
		plainCache.ByObject[o] = cache.ByObject{Field: fields.Everything()}
	}
	plain, err := newManager(plainCache)
	if err == nil {
		err = controllers.Setup(ctx, plain, controllers.Options{})
	}
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	brokeredCache := controllers.CacheOptions()
	brokeredCache.DefaultNamespaces = map[string]cache.Config{brokeredNamespace: {}}
	brokered, err := newManager(brokeredCache, countingClient)
	if err == nil {
		err = controllers.Setup(ctx, brokered, controllers.Options{Registrar: registrar})
	}
	if err != nil {
		return fmt.Errorf("brokered manager: %w", err)
	}
	withCA, err := startCAManager(ctx)
	if err != nil {
		return err
	}
	for _, mgr := range []ctrl.Manager{plain, brokered, withCA} {
		go func() {
			if err := mgr.Start(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "manager stopped: %v\n", err)
			}
		}()
	}
	return nil
}

func newManager(cacheOpts cache.Options, newClient ...client.NewClientFunc) (ctrl.Manager, error) {
	skip := true
	var nc client.NewClientFunc
	if len(newClient) > 0 {
		nc = newClient[0]
	}
	return ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cacheOpts,
		NewClient:              nc,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Two managers in one process register controllers with the same names.
		Controller: config.Controller{SkipNameValidation: &skip},
	})
}

// writes counts the brokered manager's API writes (and gets) by "verb kind namespace/name" (status
// writes as kind "Agent/status"), to prove reconciles write only what changed.
var writes = &writeLog{counts: map[string]int{}}

type writeLog struct {
	mu     sync.Mutex
	counts map[string]int
}

func (w *writeLog) add(verb string, obj any, sub string) {
	type named interface {
		GetName() string
		GetNamespace() string
	}
	n, ok := obj.(named)
	if !ok {
		return
	}
	kind := fmt.Sprintf("%T", obj)
	if o, ok := obj.(runtime.Object); ok {
		if gvk, err := apiutil.GVKForObject(o, scheme); err == nil {
			kind = gvk.Kind
		}
	}
	if u, ok := obj.(interface{ GetKind() string }); ok && u.GetKind() != "" {
		kind = u.GetKind()
	}
	if sub != "" {
		kind += "/" + sub
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts[verb+" "+kind+" "+n.GetNamespace()+"/"+n.GetName()]++
}

// count sums the writes whose key contains every part.
func (w *writeLog) count(parts ...string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	total := 0
	for k, n := range w.counts {
		match := true
		for _, p := range parts {
			match = match && strings.Contains(k, p)
		}
		if match {
			total += n
		}
	}
	return total
}

// countingClient is the manager's client with every write recorded in writes.
func countingClient(cfg *rest.Config, opts client.Options) (client.Client, error) {
	c, err := client.NewWithWatch(cfg, opts)
	if err != nil {
		return nil, err
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			obj.SetNamespace(key.Namespace)
			obj.SetName(key.Name)
			writes.add("get", obj, "")
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			writes.add("create", obj, "")
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			writes.add("update", obj, "")
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			writes.add("patch", obj, "")
			return c.Patch(ctx, obj, patch, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			writes.add("apply", obj, "")
			return c.Apply(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			writes.add("delete", obj, "")
			return c.Delete(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			writes.add("patch", obj, sub)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			writes.add("update", obj, sub)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}), nil
}

func zapLevel() int8 {
	if os.Getenv("TEST_VERBOSE") != "" {
		return -2
	}
	return 1 // errors only, keeps `go test` output readable
}

// eventually polls check until it returns nil or 20 s pass.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, what, check)
}

// newNamespace creates a namespace for one test, bound to org acme by the suite's Tenant, and
// deletes it when the test ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-", Labels: map[string]string{suiteTenantLabel: "acme"}}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}

// applyYAML creates the object a manifest describes, as kubectl would, and returns the API error.
func applyYAML(ns, manifest string) error {
	return testenv.Create(context.Background(), k8s, ns, manifest)
}

func getAgent(t *testing.T, ns, name string) *a2av1.Agent {
	t.Helper()
	a := &a2av1.Agent{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
		t.Fatalf("get agent %s/%s: %v", ns, name, err)
	}
	return a
}

func getPolicy(t *testing.T, ns, name string) *a2av1.ConversationPolicy {
	t.Helper()
	p := &a2av1.ConversationPolicy{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
		t.Fatalf("get policy %s/%s: %v", ns, name, err)
	}
	return p
}

// conditionIs checks one condition's status and reason and that it describes the current generation.
func conditionIs(conds []metav1.Condition, generation int64, condType string, status metav1.ConditionStatus, reason string) error {
	c := meta.FindStatusCondition(conds, condType)
	switch {
	case c == nil:
		return fmt.Errorf("condition %s missing (have %v)", condType, conds)
	case c.Status != status || c.Reason != reason:
		return fmt.Errorf("condition %s = %s/%s (%s), want %s/%s", condType, c.Status, c.Reason, c.Message, status, reason)
	case c.ObservedGeneration != generation:
		return fmt.Errorf("condition %s observedGeneration %d, want %d", condType, c.ObservedGeneration, generation)
	}
	return nil
}

// agentManifest is a minimal valid Agent with optional extra spec lines and labels.
func agentManifest(name, org, unit string, labels map[string]string, extraSpec string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: %s\n", name)
	if len(labels) > 0 {
		b.WriteString("  labels:\n")
		for k, v := range labels {
			fmt.Fprintf(&b, "    %s: %q\n", k, v)
		}
	}
	fmt.Fprintf(&b, "spec:\n  orgID: %s\n  unitID: %s\n  card:\n    name: %s\n    description: test agent\n", org, unit, name)
	b.WriteString(extraSpec)
	return b.String()
}

func getUnstructuredAgent(t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("a2a.fleet.dev/v1alpha1")
	u.SetKind("Agent")
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
		t.Fatalf("get agent %s/%s: %v", ns, name, err)
	}
	return u
}

// updateAgent applies mutate to the latest version of an Agent, retrying on the version conflicts
// that the controller's concurrent finalizer and status writes cause.
func updateAgent(t *testing.T, ns, name string, mutate func(*a2av1.Agent)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a := getAgent(t, ns, name)
		mutate(a)
		return k8s.Update(context.Background(), a)
	}); err != nil {
		t.Fatalf("update agent %s/%s: %v", ns, name, err)
	}
}

// updatePolicy is updateAgent for ConversationPolicies.
func updatePolicy(t *testing.T, ns, name string, mutate func(*a2av1.ConversationPolicy)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getPolicy(t, ns, name)
		mutate(p)
		return k8s.Update(context.Background(), p)
	}); err != nil {
		t.Fatalf("update policy %s/%s: %v", ns, name, err)
	}
}
