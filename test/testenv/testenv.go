// Package testenv starts the real control plane the test suites run against and holds the small
// helpers they share. It is imported by tests only.
package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/controlplane"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

// ExistingClusterEnv names the variable that points the suites at the cluster in KUBECONFIG
// (kind) instead of a local control plane.
const ExistingClusterEnv = "E2E_USE_EXISTING_CLUSTER"

// ControlPlane is a running kube-apiserver + etcd with the CRDs installed.
type ControlPlane struct {
	Config *rest.Config
	Client client.Client
	Scheme *runtime.Scheme
	env    *envtest.Environment
	// kcm is kube-controller-manager, when the suite runs one (Options.ControllerManager).
	kcm *controlplane.ControllerManager
	// kcmDir holds kube-controller-manager's kubeconfig and certificates; removed by Stop.
	kcmDir string
}

// Options are a suite's choices of control plane.
type Options struct {
	// ControllerManager also runs kube-controller-manager (internal/controlplane's
	// DefaultControllers: garbage collection, namespace deletion, ClusterRole aggregation), from
	// KUBEBUILDER_ASSETS, so owned objects go with their owners as on a cluster.
	ControllerManager bool
	// Controllers replaces the controllers it runs (e.g. with the Deployment and ReplicaSet
	// controllers added, for a suite that runs workload pods itself).
	Controllers []string
}

// NewScheme holds the Kubernetes and a2a-fleet types.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(a2av1.AddToScheme(s))
	return s
}

// Start runs the control plane built by hack/build-control-plane.sh (KUBEBUILDER_ASSETS) with
// the CRDs of repoRoot/config/crd/bases, or uses the cluster in KUBECONFIG when
// E2E_USE_EXISTING_CLUSTER=1. It never falls back to skipping: without binaries it fails.
func Start(repoRoot string) (*ControlPlane, error) { return StartWith(repoRoot, Options{}) }

// StartWith is Start with Options.
func StartWith(repoRoot string, o Options) (*ControlPlane, error) {
	existing := os.Getenv(ExistingClusterEnv) == "1"
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		UseExistingCluster:    &existing,
	}
	if !existing {
		assets := os.Getenv("KUBEBUILDER_ASSETS")
		if assets == "" {
			return nil, errors.New("KUBEBUILDER_ASSETS is not set: run `make test` (it builds kube-apiserver and etcd with hack/build-control-plane.sh), or set " + ExistingClusterEnv + "=1 with KUBECONFIG")
		}
		env.BinaryAssetsDirectory = assets
		// /debug/pprof for the benchmarks (admin credentials only): where the apiserver's CPU goes.
		env.ControlPlane.GetAPIServer().Configure().Set("profiling", "true")
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	scheme := NewScheme()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("client: %w", err)
	}
	v, err := discovery.NewDiscoveryClientForConfigOrDie(cfg).ServerVersion()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("server version: %w", err)
	}
	// Evidence in the test log of what the suite ran against.
	fmt.Printf("envtest: kube-apiserver %s (%s) from %s\n", v.GitVersion, v.Platform, cmpOr(env.BinaryAssetsDirectory, "KUBECONFIG"))
	cp := &ControlPlane{Config: cfg, Client: c, Scheme: scheme, env: env}
	if o.ControllerManager && !existing {
		dir, err := os.MkdirTemp("", "testenv-kcm-")
		if err == nil {
			cp.kcmDir = dir
			cp.kcm, err = controlplane.StartControllerManager(context.Background(), controlplane.ControllerManagerConfig{
				Binary: filepath.Join(env.BinaryAssetsDirectory, controlplane.ControllerManagerBinary), Config: cfg, Dir: dir,
				Controllers: o.Controllers,
			})
		}
		if err != nil {
			_ = cp.Stop()
			return nil, err
		}
		fmt.Printf("envtest: kube-controller-manager (%s) from %s\n", strings.Join(cmpOrSlice(o.Controllers, controlplane.DefaultControllers), ", "), env.BinaryAssetsDirectory)
	}
	return cp, nil
}

// Stop stops the control plane (a no-op for an existing cluster).
func (c *ControlPlane) Stop() error {
	if c.kcm != nil {
		_ = c.kcm.Stop()
	}
	if c.kcmDir != "" {
		_ = os.RemoveAll(c.kcmDir)
	}
	return c.env.Stop()
}

// Main runs a package's tests against a control plane started by Start and exits.
func Main(m *testing.M, repoRoot string, setup func(*ControlPlane) error) {
	MainWith(m, repoRoot, Options{}, setup)
}

// MainWith is Main with Options.
func MainWith(m *testing.M, repoRoot string, o Options, setup func(*ControlPlane) error) {
	cp, err := StartWith(repoRoot, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if err := setup(cp); err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
	} else {
		code = m.Run()
	}
	if err := cp.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop control plane:", err)
	}
	os.Exit(code)
}

// Eventually polls check until it returns nil, failing the test with the last error once
// timeout has passed.
func Eventually(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: still failing after %s: %v", what, timeout, err)
}

func cmpOrSlice(a, b []string) []string {
	if len(a) > 0 {
		return a
	}
	return b
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// StartOperator runs the broker runtime and the controllers on backend, scoped to a fresh
// namespace (named with prefix) that it returns, bound to org "acme" (the org the suites' Agents
// claim) by a Tenant; the operator stops and the Tenant goes when the test ends.
func (c *ControlPlane) StartOperator(t testing.TB, ctx context.Context, prefix string, backend acl.Backend, brokerURL string, opts controllers.Options) string {
	t.Helper()
	return c.StartOperatorWith(t, ctx, Operator{Prefix: prefix, Broker: registration.BrokerConfig{URL: brokerURL, Backend: backend}, Controllers: opts}).Namespace
}

// StartTenantOperator is StartOperator over fresh namespaces, one per org, each bound to its org
// by a Tenant; it returns org → namespace.
func (c *ControlPlane) StartTenantOperator(t testing.TB, ctx context.Context, prefix string, backend acl.Backend, brokerURL string, opts controllers.Options, orgs ...string) map[string]string {
	t.Helper()
	return c.StartOperatorWith(t, ctx, Operator{Prefix: prefix, Orgs: orgs, Broker: registration.BrokerConfig{URL: brokerURL, Backend: backend}, Controllers: opts}).Namespaces
}

// NewNamespace creates a namespace named with prefix.
func (c *ControlPlane) NewNamespace(t testing.TB, ctx context.Context, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := c.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// BindNamespace creates a Tenant (named after the namespace) that binds ns to org, deleted when
// the test ends.
func (c *ControlPlane) BindNamespace(t testing.TB, ctx context.Context, ns, org string) {
	t.Helper()
	tenant := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "testenv-" + ns}, Spec: a2av1.TenantSpec{OrgID: org, Namespaces: []string{ns}}}
	if err := c.Client.Create(ctx, tenant); err != nil {
		t.Fatalf("create tenant: %v", err)
	}
	t.Cleanup(func() { _ = c.Client.Delete(context.Background(), tenant) })
}

// Operator configures StartOperatorWith.
type Operator struct {
	// Prefix names the operator's fresh namespaces.
	Prefix string
	// Orgs are the orgs of the fresh namespaces, one namespace per org, each bound to its org by
	// a Tenant. Empty means one namespace bound to "acme".
	Orgs []string
	// Namespaces, when set, are existing namespaces (key → namespace) the operator watches
	// instead of fresh ones; the caller binds them (NewNamespace, BindNamespace). Orgs is unused.
	Namespaces map[string]string
	// Broker configures the broker runtime (URL and Backend at least; the manager's client,
	// cache, recorder and log are filled in).
	Broker registration.BrokerConfig
	// Controllers are the controllers' options (the Registrar is the broker runtime's).
	Controllers controllers.Options
	// Admin, when set, makes the broker runtime build its own backend with the factory and open
	// it (as cmd/manager does) instead of using Broker.Backend; Broker.URL defaults to its URL.
	Admin *brokers.Config
	// NoControllers runs only the broker runtime (to test it alone).
	NoControllers bool
	// Config, when set, replaces the control plane's config for the operator's manager (e.g.
	// with a transport that counts the operator's requests).
	Config *rest.Config
}

// RunningOperator is a started operator.
type RunningOperator struct {
	// Namespace is the namespace of the first org; Namespaces maps every org to its namespace.
	Namespace  string
	Namespaces map[string]string
	Broker     *registration.Broker
	Manager    ctrl.Manager
}

// StartOperatorWith runs the broker runtime and the controllers as cmd/manager does, scoped to
// fresh namespaces bound to their orgs (or o.Namespaces); it stops when the test ends.
func (c *ControlPlane) StartOperatorWith(t testing.TB, ctx context.Context, o Operator) RunningOperator {
	t.Helper()
	if o.Namespaces == nil {
		if len(o.Orgs) == 0 {
			o.Orgs = []string{"acme"}
		}
		o.Namespaces = map[string]string{}
		for _, org := range o.Orgs {
			ns := c.NewNamespace(t, ctx, o.Prefix)
			c.BindNamespace(t, ctx, ns, org)
			o.Namespaces[org] = ns
		}
	}
	run, stop, err := c.RunOperator(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Orgs) > 0 {
		run.Namespace = run.Namespaces[o.Orgs[0]]
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return run
}

// RunOperator runs the broker runtime and the controllers as cmd/manager does, scoped to the
// existing namespaces o.Namespaces, until stop is called (stop waits for the manager to end and
// returns its error). It needs no test: the fleet benchmark runs it in a child process.
func (c *ControlPlane) RunOperator(ctx context.Context, o Operator) (run RunningOperator, stop func() error, err error) {
	run = RunningOperator{Namespaces: o.Namespaces}
	cacheOpts := controllers.CacheOptions()
	cacheOpts.DefaultNamespaces = map[string]cache.Config{}
	for _, ns := range run.Namespaces {
		cacheOpts.DefaultNamespaces[ns] = cache.Config{}
	}
	if o.Broker.ServiceSecret != nil {
		cacheOpts.DefaultNamespaces[o.Broker.ServiceSecret.Namespace] = cache.Config{}
	}
	skip := true // several operators in one process register controllers with the same names
	cfg := c.Config
	if o.Config != nil {
		cfg = o.Config
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: c.Scheme, Cache: cacheOpts,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		return run, nil, fmt.Errorf("manager: %w", err)
	}
	// The operator's broker side runs as in cmd/manager: a manager runnable.
	bc := o.Broker
	bc.Client, bc.Cache, bc.Recorder = mgr.GetClient(), mgr.GetCache(), mgr.GetEventRecorder("a2a-fleet-broker")
	if bc.Log.GetSink() == nil {
		bc.Log = ctrl.Log.WithName("broker")
	}
	if o.Admin != nil {
		admin := *o.Admin
		admin.URL = cmp.Or(admin.URL, bc.URL)
		if admin.TLS == nil {
			admin.TLS = bc.TLS
		}
		b, err := brokers.New(admin)
		if err != nil {
			return run, nil, fmt.Errorf("broker backend: %w", err)
		}
		bc.URL, bc.Backend, bc.Open = cmp.Or(bc.URL, b.URL), b.Backend, b.Open
	}
	broker, err := registration.NewBroker(bc)
	if err != nil {
		return run, nil, fmt.Errorf("broker runtime: %w", err)
	}
	if err := mgr.Add(broker); err != nil {
		return run, nil, fmt.Errorf("add broker runtime: %w", err)
	}
	if !o.NoControllers {
		opts := o.Controllers
		opts.Registrar = broker.Registrar()
		opts.Presence, opts.PresenceEvents = broker, broker.PresenceEvents()
		if err := controllers.Setup(ctx, mgr, opts); err != nil {
			return run, nil, fmt.Errorf("setup: %w", err)
		}
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	run.Broker, run.Manager = broker, mgr
	return run, func() error { cancel(); return <-done }, nil
}
