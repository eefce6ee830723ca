// Command manager runs the a2a-fleet operator: the Agent and ConversationPolicy controllers, and,
// when a broker is configured, agent registration on it.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/telemetry"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/internal/version"
)

type options struct {
	metricsAddr, probeAddr string
	leaderElect            bool
	leaderElectionNS       string

	broker             brokerOptions
	brokerResyncPeriod time.Duration
	orphanInterval     time.Duration
	// kubeAPIQPS and kubeAPIBurst limit the operator's requests to the Kubernetes API on the
	// client side (QPS < 0: no limit, the API server's priority and fairness queues them).
	kubeAPIQPS        float64
	kubeAPIBurst      int
	workloadBrokerURL string
	workloadBrokerCA  string
	gate              bool
	serviceSecret     string
	// gatewayCardSigningSecret is NAMESPACE/NAME of the HTTP gateway's card signing keys, which
	// the operator creates when missing ("": not created).
	gatewayCardSigningSecret string

	// controllers holds the options that belong to the controllers (their own flags).
	controllers controllers.Options
}

// brokerOptions say how the operator reaches and administers the broker.
type brokerOptions struct {
	// kind is the backend (internal/mqtt/brokers: dynsec, embedded).
	kind string
	url  string
	// adminSecret is NAMESPACE/NAME of the dynsec admin's credentials; generateAdminSecret creates
	// it with a random password when it is missing (a broker installed with the operator).
	adminSecret         string
	generateAdminSecret bool
	// TLS to the broker (tls:// URLs).
	caFile, clientCertFile, clientKeyFile string
	insecureSkipVerify                    bool
	// readinessGrace is how long the broker may be unreachable before /readyz fails (0: never).
	readinessGrace time.Duration
	// cardSigningSecret is NAMESPACE/NAME of the card signing keys ("": cards unsigned);
	// generateCardSigningSecret creates it with one new key when it is missing.
	cardSigningSecret         string
	generateCardSigningSecret bool
	// cardKeysURL is the signatures' jku when the key set is also served over HTTP ("": the
	// retained topic's {broker URL}/$a2a-fleet/v1/card-keys).
	cardKeysURL string
}

func main() {
	var o options
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; \"0\" disables it.")
	flag.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader so that only one replica reconciles at a time.")
	flag.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader-election Lease (defaults to the pod's namespace).")
	flag.StringVar(&o.broker.url, "broker-url", "", "MQTT v5 broker (mqtt://host:1883 or tls://host:8883): where the operator administers it (--broker-backend dynsec) or where it runs the embedded broker (embedded). Empty: run without a broker (Agents report BrokerNotConfigured).")
	flag.StringVar(&o.broker.kind, "broker-backend", brokers.Dynsec, fmt.Sprintf("How the operator manages the broker's identities: one of %v (dynsec: Mosquitto's dynamic-security plugin; embedded: a broker in the operator's process).", brokers.Kinds()))
	flag.StringVar(&o.broker.adminSecret, "broker-admin-secret", "", "NAMESPACE/NAME of a Secret with keys username and password of a dynsec admin.")
	flag.BoolVar(&o.broker.generateAdminSecret, "broker-admin-secret-generate", false, "Create the --broker-admin-secret (username admin, a random password) when it does not exist: for a broker installed with the operator that initialises dynsec from that Secret (config/mosquitto).")
	flag.StringVar(&o.broker.caFile, "broker-ca-file", "", "PEM CA bundle to verify the broker's TLS certificate (tls:// URLs; default: the system roots).")
	flag.StringVar(&o.broker.clientCertFile, "broker-client-cert-file", "", "PEM client certificate for a broker that requires mutual TLS (with --broker-client-key-file).")
	flag.StringVar(&o.broker.clientKeyFile, "broker-client-key-file", "", "PEM private key of --broker-client-cert-file.")
	flag.BoolVar(&o.broker.insecureSkipVerify, "broker-insecure-skip-verify", false, "Do not verify the broker's TLS certificate (testing only).")
	flag.StringVar(&o.broker.cardSigningSecret, "card-signing-secret", "", "NAMESPACE/NAME of a Secret whose PEM private keys (entries tls.key or *.pem; ECDSA P-256 or Ed25519) sign every agent card (A2A v1.0 §8.4); the public keys are retained on $a2a-fleet/v1/card-keys. Empty: cards are published unsigned.")
	flag.StringVar(&o.broker.cardKeysURL, "card-keys-url", "", "URL of the card signing key set over HTTP, put in every signature's jku (e.g. the gateway's https://GATEWAY/.well-known/jwks.json). Empty: {broker URL}/$a2a-fleet/v1/card-keys.")
	flag.StringVar(&o.gatewayCardSigningSecret, "gateway-card-signing-secret", "", "NAMESPACE/NAME of the HTTP gateway's card signing Secret, created with one new ES256 key when it does not exist; the gateway mounts it (--card-signing-dir) to sign the cards it serves over HTTP. Empty: not created.")
	flag.BoolVar(&o.broker.generateCardSigningSecret, "card-signing-secret-generate", false, "Create the --card-signing-secret with one new ES256 key when it does not exist.")
	flag.DurationVar(&o.broker.readinessGrace, "broker-readiness-grace", 30*time.Second, "/readyz fails once the broker has been unreachable for longer than this (0 disables the broker check).")
	flag.DurationVar(&o.orphanInterval, "broker-orphan-interval", registration.DefaultOrphanInterval, "How often the broker is searched for the clients and roles of identities no Agent claims (an Agent deleted without its finalizer); they are deleted when found in two searches in a row (0 disables it: only for a broker shared with objects under the a2a: prefix that this operator does not own).")
	flag.DurationVar(&o.brokerResyncPeriod, "broker-resync-period", controllers.DefaultResyncPeriod, "How often each registered Agent is checked against the broker (drift repair), ±20% jitter.")
	flag.StringVar(&o.workloadBrokerURL, "workload-broker-url", "", "Broker URL injected into agent workloads as A2A_BROKER (default: --broker-url).")
	flag.StringVar(&o.workloadBrokerCA, "workload-broker-ca-file", "", "PEM CA bundle the agent workloads verify their broker with: every Agent's credentials Secret carries it (key ca.crt, this file is polled every 10 s and read at each reconcile: a rotated CA is written without a new password or a pod restart) and the workloads get A2A_TLS_CA naming it. Needs a TLS workload broker URL. Default: --broker-ca-file when the workload broker URL is a TLS one (tls://, mqtts://, ssl://, wss://).")
	flag.BoolVar(&o.gate, "gate-governed-agents", false, "Put the conversation service in front of every Agent a ConversationPolicy governs (deploy config/conversation-service with it).")
	flag.StringVar(&o.serviceSecret, "conversation-service-secret", "a2a-fleet-system/a2a-fleet-conversation-service-credentials", "NAMESPACE/NAME of the Secret the operator writes the conversation service's broker credentials to (with --gate-governed-agents).")
	flag.Float64Var(&o.kubeAPIQPS, "kube-api-qps", -1, "Requests per second the operator may make to the Kubernetes API (client-side limit). Negative: no client-side limit, the API server's priority and fairness queues them (controller-runtime's default). A rollout costs the operator about 3 requests per Agent (the finalizer, the credentials Secret, one status patch), so a limit of 20 would hold a 10 000-Agent rollout to about 1 500 s.")
	flag.IntVar(&o.kubeAPIBurst, "kube-api-burst", 0, "Requests above --kube-api-qps the operator may make at once (0 with a positive --kube-api-qps: client-go's default burst).")
	o.controllers.BindFlags(flag.CommandLine)
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "Print the version and source commit, and exit.")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get().String("manager"))
		return
	}
	// Served on the operator's /metrics with controller-runtime's and the controllers' metrics.
	ctrlmetrics.Registry.MustRegister(version.NewCollector())
	log := newLogger(&zapOpts)
	ctrl.SetLogger(log)

	if err := run(o); err != nil {
		ctrl.Log.Error(err, "manager exited")
		os.Exit(1)
	}
}

// newLogger is the one logger of the process: controller-runtime, client-go (klog) and the broker
// clients (slog) all write through it. Stack traces only for panics: an error the operator
// retries (a broker restart, a conflict) is a log line, not a crash report (--zap-stacktrace-level
// changes it).
func newLogger(opts *zap.Options) logr.Logger {
	if opts.StacktraceLevel == nil {
		opts.StacktraceLevel = zapcore.PanicLevel
	}
	log := zap.New(zap.UseFlagOptions(opts))
	klog.SetLogger(log)
	slog.SetDefault(slog.New(logr.ToSlogHandler(log)))
	return log
}

func run(o options) error {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(a2av1.AddToScheme(scheme))

	cfg := ctrl.GetConfigOrDie()
	cfg.QPS, cfg.Burst = float32(o.kubeAPIQPS), o.kubeAPIBurst
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "a2a-fleet-operator.a2a.fleet.dev",
		LeaderElectionNamespace: o.leaderElectionNS,
		// Release the lease on shutdown so a new replica takes over without waiting for expiry.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	// Tracing of the operator's broker clients: off unless the standard OTEL_EXPORTER_OTLP_*
	// environment names an endpoint.
	shutdownTracing, err := telemetry.Setup(ctx, "a2a-fleet-operator")
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(flush); err != nil {
			ctrl.Log.Info("could not flush the last trace spans", "error", err.Error())
		}
	}()
	copts := o.controllers
	copts.ResyncPeriod = o.brokerResyncPeriod
	copts.WorkloadBrokerURL = cmp.Or(o.workloadBrokerURL, o.broker.url)
	if copts.WorkloadBrokerCAFile, err = workloadBrokerCAFile(copts.WorkloadBrokerURL, o.workloadBrokerCA, o.broker.caFile); err != nil {
		return err
	}
	readyz := healthz.Checker(healthz.Ping)
	// One caller graph and one Agent count index for the controllers and the Registrar (Setup
	// keeps the graph from the informer; the counts register their own handler).
	copts.CallerGraph = tenancy.NewCallerGraph()
	copts.AgentCounts = tenancy.NewAgentCounts(mgr.GetCache())
	if o.broker.url != "" {
		reader := tenancy.WithAgentCounts(tenancy.WithCallerGraph(mgr.GetClient(), copts.CallerGraph), copts.AgentCounts)
		broker, err := brokerRuntime(ctx, mgr, reader, o.broker, o.gate, o.serviceSecret, o.orphanInterval)
		if err != nil {
			return err
		}
		// The broker connections live as long as the manager (leader only) and report in /readyz.
		if err := mgr.Add(broker); err != nil {
			return fmt.Errorf("add broker runtime: %w", err)
		}
		copts.Registrar = broker.Registrar()
		copts.AgentResyncs = broker.AgentResyncs()
		copts.Presence, copts.PresenceEvents = broker, broker.PresenceEvents()
		copts.Gating = o.gate
		if o.broker.kind == brokers.Dynsec {
			copts.PoolsUnsupported = controllers.PoolsUnsupportedOnMosquitto
		}
		if o.broker.readinessGrace > 0 {
			readyz = broker.Checker(o.broker.readinessGrace)
		}
	} else if o.gate {
		return errors.New("--gate-governed-agents needs --broker-url")
	}
	if o.gatewayCardSigningSecret != "" {
		keys, err := gatewayCardKeys(o.gatewayCardSigningSecret, mgr.GetAPIReader(), mgr.GetClient())
		if err != nil {
			return err
		}
		if err := mgr.Add(keys); err != nil {
			return fmt.Errorf("add gateway card keys: %w", err)
		}
	}
	copts.Metrics = ctrlmetrics.Registry
	if err := controllers.Setup(ctx, mgr, copts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", readyz); err != nil {
		return fmt.Errorf("add ready check: %w", err)
	}
	ctrl.Log.Info("starting manager", "leaderElection", o.leaderElect, "broker", o.broker.url, "gating", copts.Gating,
		"maxConcurrentReconciles", copts.MaxConcurrentReconciles, "workloadSecurityFloor", copts.WorkloadSecurityFloor, "workloadBrokerCAFile", copts.WorkloadBrokerCAFile, "tracing", telemetry.Enabled())
	// Start returns when the signal handler cancels ctx (SIGTERM/SIGINT): controllers drain and the
	// leader lease is released.
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}
