// Command manager runs the a2a-fleet operator: the Agent and ConversationPolicy controllers, and,
// when a broker is configured, agent registration on it.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

type options struct {
	metricsAddr, probeAddr string
	leaderElect            bool
	leaderElectionNS       string

	brokerURL          string
	brokerAdminSecret  string
	brokerCAFile       string
	brokerInsecureTLS  bool
	brokerResyncPeriod time.Duration
	workloadBrokerURL  string
	gate               bool
	serviceSecret      string
}

func main() {
	var o options
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; \"0\" disables it.")
	flag.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader so that only one replica reconciles at a time.")
	flag.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader-election Lease (defaults to the pod's namespace).")
	flag.StringVar(&o.brokerURL, "broker-url", "", "MQTT v5 broker with Mosquitto's dynamic-security plugin (mqtt://host:1883 or tls://host:8883). Empty: run without a broker (Agents report BrokerNotConfigured).")
	flag.StringVar(&o.brokerAdminSecret, "broker-admin-secret", "", "NAMESPACE/NAME of a Secret with keys username and password of a dynsec admin.")
	flag.StringVar(&o.brokerCAFile, "broker-ca-file", "", "PEM CA bundle to verify the broker's TLS certificate (tls:// URLs).")
	flag.BoolVar(&o.brokerInsecureTLS, "broker-insecure-skip-verify", false, "Do not verify the broker's TLS certificate (testing only).")
	flag.DurationVar(&o.brokerResyncPeriod, "broker-resync-period", controllers.DefaultResyncPeriod, "How often each registered Agent is checked against the broker (drift repair), ±20% jitter.")
	flag.StringVar(&o.workloadBrokerURL, "workload-broker-url", "", "Broker URL injected into agent workloads as A2A_BROKER (default: --broker-url).")
	flag.BoolVar(&o.gate, "gate-governed-agents", false, "Put the conversation service in front of every Agent a ConversationPolicy governs (deploy config/conversation-service with it).")
	flag.StringVar(&o.serviceSecret, "conversation-service-secret", "a2a-fleet-system/a2a-fleet-conversation-service-credentials", "NAMESPACE/NAME of the Secret the operator writes the conversation service's broker credentials to (with --gate-governed-agents).")
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	if err := run(o); err != nil {
		ctrl.Log.Error(err, "manager exited")
		os.Exit(1)
	}
}

func run(o options) error {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(a2av1.AddToScheme(scheme))

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
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
	copts := controllers.Options{ResyncPeriod: o.brokerResyncPeriod, WorkloadBrokerURL: cmp.Or(o.workloadBrokerURL, o.brokerURL)}
	readyz := healthz.Checker(healthz.Ping)
	if o.brokerURL != "" {
		broker, err := dynsecBroker(ctx, mgr, o)
		if err != nil {
			return err
		}
		// The broker connections live as long as the manager (leader only) and report in /readyz.
		if err := mgr.Add(broker); err != nil {
			return fmt.Errorf("add broker runtime: %w", err)
		}
		copts.Registrar = broker.Registrar()
		copts.Gating = o.gate
		readyz = broker.Checker(30 * time.Second)
	} else if o.gate {
		return errors.New("--gate-governed-agents needs --broker-url")
	}
	if err := controllers.Setup(ctx, mgr, copts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", readyz); err != nil {
		return fmt.Errorf("add ready check: %w", err)
	}
	ctrl.Log.Info("starting manager", "leaderElection", o.leaderElect, "broker", o.brokerURL)
	// Start returns when the signal handler cancels ctx (SIGTERM/SIGINT): controllers drain and the
	// leader lease is released.
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// dynsecBroker reads the admin credentials (once, through the API server: the cache is not
// running yet) and returns the broker runtime, which connects when the manager starts it.
func dynsecBroker(ctx context.Context, mgr ctrl.Manager, o options) (*registration.Broker, error) {
	ns, name, ok := strings.Cut(o.brokerAdminSecret, "/")
	if !ok || ns == "" || name == "" {
		return nil, errors.New("--broker-admin-secret must be NAMESPACE/NAME when --broker-url is set")
	}
	secret := &corev1.Secret{}
	if err := mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, secret); err != nil {
		return nil, fmt.Errorf("read broker admin secret %s: %w", o.brokerAdminSecret, err)
	}
	user, pass := string(secret.Data["username"]), string(secret.Data["password"])
	if user == "" || pass == "" {
		return nil, fmt.Errorf("broker admin secret %s needs non-empty keys username and password", o.brokerAdminSecret)
	}
	var tlsCfg *tls.Config
	if o.brokerCAFile != "" || o.brokerInsecureTLS {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.brokerInsecureTLS} //nolint:gosec // opt-in flag for tests
		if o.brokerCAFile != "" {
			pem, err := os.ReadFile(o.brokerCAFile)
			if err != nil {
				return nil, fmt.Errorf("read broker CA file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("broker CA file %s holds no PEM certificate", o.brokerCAFile)
			}
			tlsCfg.RootCAs = pool
		}
	}
	cfg := registration.BrokerConfig{URL: o.brokerURL, TLS: tlsCfg, Client: mgr.GetClient(), Cache: mgr.GetCache(),
		Recorder: mgr.GetEventRecorder("a2a-fleet-broker"), Log: ctrl.Log.WithName("broker")}
	if o.gate {
		ns, name, ok := strings.Cut(o.serviceSecret, "/")
		if !ok {
			return nil, errors.New("--conversation-service-secret must be NAMESPACE/NAME")
		}
		cfg.ServiceSecret = &client.ObjectKey{Namespace: ns, Name: name}
	}
	return registration.NewDynsecBroker(cfg, dynsec.Config{Username: user, Password: pass})
}
