// Command decision-service answers a broker cluster's authentication and authorization
// questions from the operator's decision table over HTTP (internal/mqtt/decision: EMQX 5 HTTP
// authn/authz, VerneMQ webhooks, mosquitto-go-auth's HTTP backend). Each replica builds its own
// table from the Kubernetes objects (Agents, Tenants, AgentGrants, Namespaces and the Agents'
// credential Secrets) with the operator's pure compile, so replicas need no leader, no broker
// and no operator: run several behind one Service. A replica refuses everything until its first
// full pass (readiness false, fail closed). docs/scale.md, "Running on an EMQX cluster".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/decision"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/internal/version"
)

type options struct {
	listen, probeAddr, metricsAddr string
	adminUsername, adminPassFile   string
	serviceSecret                  string
	gate                           bool
	cacheMaxAge, resync            time.Duration
	maxBody                        int64
}

func main() {
	var o options
	flag.StringVar(&o.listen, "listen", ":8090", "Address of the decision endpoint (/emqx/authn, /emqx/authz, /vernemq/{hook}, /mosquitto-go-auth/{user,superuser,acl}).")
	flag.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz (ready after the first full table pass).")
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", "0", "Address of the Prometheus metrics endpoint; \"0\" disables it.")
	flag.StringVar(&o.adminUsername, "admin-username", "", "A superuser the table admits (the operator's own broker connections, an administrator); empty: none.")
	flag.StringVar(&o.adminPassFile, "admin-password-file", "", "File holding --admin-username's password (a mounted Secret).")
	flag.StringVar(&o.serviceSecret, "conversation-service-secret", "", "NAMESPACE/NAME of the conversation service's credentials Secret (as the operator's flag): its identity is in the table. Empty: no service identity.")
	flag.BoolVar(&o.gate, "gate-governed-agents", false, "As the operator's flag: governed Agents are reached through the conversation service (must match the operator's).")
	flag.DurationVar(&o.cacheMaxAge, "vernemq-cache-max-age", 0, "cache-control max-age sent to VerneMQ with every allow (0: none). Revocation waits up to this long.")
	flag.DurationVar(&o.resync, "resync-period", time.Minute, "A full pass at least this often, besides the passes every change triggers.")
	flag.Int64Var(&o.maxBody, "max-body-bytes", decision.DefaultMaxBody, "Largest request body accepted (413 beyond).")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "Print the version and source commit, and exit.")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get().String("decision-service"))
		return
	}
	if zapOpts.StacktraceLevel == nil {
		zapOpts.StacktraceLevel = zapcore.PanicLevel
	}
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	slog.SetDefault(slog.New(logr.ToSlogHandler(log)))
	if err := run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), o, log); err != nil {
		log.Error(err, "decision service exited")
		os.Exit(1)
	}
}

// service is one replica: its manager (cache, probes), table, converger and endpoint.
type service struct {
	mgr       manager.Manager
	store     *embedded.Store
	converger *converger
	handler   *decision.Handler
}

func newService(ctx context.Context, cfg *rest.Config, o options, log logr.Logger) (*service, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(a2av1.AddToScheme(scheme))
	managed := labels.SelectorFromSet(labels.Set{identity.LabelManagedBy: identity.ManagedByValue})
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress: o.probeAddr,
		// Only the operator's Secrets (the Agents' credentials, the service's): as its cache.
		Cache: cache.Options{DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {Label: managed}}},
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	// The indexes the tenancy view and the caller rules read through (as the operator's).
	if err := tenancy.IndexFields(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &a2av1.Agent{}, identity.IndexAgentCallerRule, func(obj client.Object) []string {
		return registration.RuleIndexValues(obj.(*a2av1.Agent))
	}); err != nil {
		return nil, fmt.Errorf("index agents by caller rule: %w", err)
	}
	storeCfg := embedded.StoreConfig{AdminUsername: o.adminUsername}
	if o.adminUsername != "" {
		pw, err := os.ReadFile(o.adminPassFile)
		if err != nil {
			return nil, fmt.Errorf("--admin-password-file: %w", err)
		}
		storeCfg.AdminPassword = strings.TrimSpace(string(pw))
	}
	store, err := embedded.NewStore(storeCfg)
	if err != nil {
		return nil, err
	}
	var svcKey *client.ObjectKey
	if o.serviceSecret != "" {
		ns, name, ok := strings.Cut(o.serviceSecret, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--conversation-service-secret %q: want NAMESPACE/NAME", o.serviceSecret)
		}
		svcKey = &client.ObjectKey{Namespace: ns, Name: name}
	}
	conv := newConverger(mgr.GetClient(), store, svcKey, o.gate, log.WithName("table"))
	if o.resync > 0 {
		conv.resync = o.resync
	}
	if err := conv.watch(ctx, mgr.GetCache()); err != nil {
		return nil, err
	}
	if err := mgr.Add(conv); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", func(*http.Request) error { return nil }); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("table", func(*http.Request) error {
		if !conv.Ready() {
			return errors.New("decision table not synced yet")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	h, err := decision.NewHandler(decision.Config{Decider: store, Ready: conv.Ready, MaxBody: o.maxBody,
		CacheMaxAge: o.cacheMaxAge, Log: log.WithName("endpoint")})
	if err != nil {
		return nil, err
	}
	return &service{mgr: mgr, store: store, converger: conv, handler: h}, nil
}

func run(ctx context.Context, cfg *rest.Config, o options, log logr.Logger) error {
	s, err := newService(ctx, cfg, o, log)
	if err != nil {
		return err
	}
	defer s.store.Close()
	srv := &http.Server{Addr: o.listen, Handler: s.handler, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() {
		log.Info("decision endpoint listening", "address", o.listen)
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("decision endpoint: %w", err)
		}
	}()
	mgrErr := make(chan error, 1)
	go func() { mgrErr <- s.mgr.Start(ctx) }()
	select {
	case err = <-errc:
	case err = <-mgrErr:
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return err
}
