// Command devstack runs the whole a2a-fleet stack on one machine with no cluster: a real
// kube-apiserver and etcd (built from source by hack/build-control-plane.sh), the CRDs, an MQTT v5
// broker (embedded mochi-mqtt, or a Mosquitto with dynsec: hack/dev-mosquitto.sh), the operator
// with gating on, the conversation service, and the samples with their example agents. It writes a
// kubeconfig so that kubectl works against it, and keeps its state in a folder so that what you
// apply survives a restart.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/controlplane"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/internal/version"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// startBroker starts the embedded broker (identities kept in the state dir) or points at a real
// Mosquitto, and adds the operator's broker runtime for it to the manager: the same runtime as
// cmd/manager's, so the conversation service's identity is reconciled like an Agent's (created,
// repaired after drift or a broker state loss, Events on its Secret), lost broker state is
// detected and the Agents re-registered, missing cards are republished, and its Checker is the
// operator's /readyz.
func startBroker(o options, stateDir string, mgr ctrl.Manager, reader client.Client) (*registration.Broker, string, func(), error) {
	cfg := registration.BrokerConfig{Client: reader, Cache: mgr.GetCache(),
		Recorder: mgr.GetEventRecorder("a2a-fleet-broker"), Log: ctrl.Log.WithName("broker"),
		ServiceSecret: &serviceSecret, OrphanInterval: registration.DefaultOrphanInterval}
	if o.cardSigningSecret != "" {
		// As the installs do (--card-signing-secret with --card-signing-secret-generate): the
		// key is created once and kept in etcd, so a restarted stack signs with the same key and
		// a key set a client saved stays valid.
		ns, name, ok := strings.Cut(o.cardSigningSecret, "/")
		if !ok || ns == "" || name == "" {
			return nil, "", nil, errors.New("--card-signing-secret must be NAMESPACE/NAME")
		}
		cfg.CardSigning = &registration.CardSigning{Secret: client.ObjectKey{Namespace: ns, Name: name},
			Generate: true, Reader: mgr.GetAPIReader()}
	}
	bc := brokers.Config{Kind: brokers.Embedded, URL: "mqtt://" + o.brokerAddr, MaxPacketSize: 1 << 20,
		SnapshotPath: filepath.Join(stateDir, "broker-identities.json")}
	if o.mosquittoURL != "" {
		if o.mosquittoPassword == "" {
			return nil, "", nil, errors.New("--mosquitto-url needs --mosquitto-admin-password (or $MOSQUITTO_ADMIN_PASSWORD)")
		}
		bc = brokers.Config{Kind: o.mosquittoBackend, URL: o.mosquittoURL, Username: o.mosquittoAdmin, Password: o.mosquittoPassword,
			Logger: slog.New(logr.ToSlogHandler(cfg.Log))}
	}
	backend, err := brokers.New(bc)
	if err != nil {
		return nil, "", nil, err
	}
	stop := func() { _ = backend.Close() }
	cfg.URL, cfg.Backend, cfg.Open = backend.URL, backend.Backend, backend.Open
	broker, err := registration.NewBroker(cfg)
	if err != nil {
		stop()
		return nil, "", nil, err
	}
	if err := mgr.Add(broker); err != nil {
		stop()
		return nil, "", nil, fmt.Errorf("add broker runtime: %w", err)
	}
	return broker, cfg.URL, stop, nil
}

// cardStatusIfSigned is the status of a retained card as the operator reads it, when the
// operator signs cards (the example agents then leave their cards to it); nil otherwise.
func cardStatusIfSigned(broker *registration.Broker, o options) func(topic string) string {
	if o.cardSigningSecret == "" {
		return nil
	}
	return broker.CardStatus
}

// brokerReadinessGrace is cmd/manager's --broker-readiness-grace default.
const brokerReadinessGrace = 30 * time.Second

type options struct {
	assets, stateDir, crdDir string
	// rbacDir holds the namespace owners' aggregated roles (config/rbac), installed as a cluster
	// install does.
	rbacDir                string
	metricsAddr, probeAddr string
	// serviceMetricsAddr and serviceProbeAddr are the conversation service's ("0" = off).
	serviceMetricsAddr, serviceProbeAddr string
	// brokerAddr is where the embedded broker listens; mosquittoURL, when set, replaces it with a
	// real Mosquitto (dynamic-security plugin) administered as mosquittoAdmin.
	brokerAddr, mosquittoURL          string
	mosquittoAdmin, mosquittoPassword string
	// mosquittoBackend is how mosquittoURL's identities are kept: brokers.Dynsec or brokers.Table.
	mosquittoBackend string
	// samples is the folder of manifests applied at start ("" applies none).
	samples string
	// controllerManager runs kube-controller-manager (internal/controlplane).
	controllerManager bool
	// cardSigningSecret is NAMESPACE/NAME of the card signing keys, generated when missing (""
	// publishes cards unsigned).
	cardSigningSecret string
}

// defaultCardSigningSecret is the Secret the installs sign cards with (config/quickstart).
const defaultCardSigningSecret = "a2a-fleet-system/a2a-fleet-card-signing"

func main() {
	var o options
	flag.StringVar(&o.assets, "assets", os.Getenv("KUBEBUILDER_ASSETS"), "Folder with kube-apiserver, etcd and kubectl (hack/build-control-plane.sh --print-assets).")
	flag.StringVar(&o.stateDir, "state-dir", "bin/dev", "Folder for the kubeconfig and etcd's data; delete it to start from scratch.")
	flag.StringVar(&o.crdDir, "crd-dir", "config/crd/bases", "Folder with the generated CRDs.")
	flag.StringVar(&o.rbacDir, "rbac-dir", "config/rbac", "Folder with the namespace owners' aggregated roles (a2a_editor_role.yaml, a2a_viewer_role.yaml), installed as a cluster install does.")
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:18080", "Operator metrics endpoint.")
	flag.StringVar(&o.probeAddr, "health-probe-bind-address", "127.0.0.1:18081", "Operator /healthz and /readyz.")
	flag.StringVar(&o.serviceMetricsAddr, "service-metrics-bind-address", "127.0.0.1:18090", "Conversation service metrics endpoint (0: off).")
	flag.StringVar(&o.serviceProbeAddr, "service-health-probe-bind-address", "127.0.0.1:18091", "Conversation service /healthz and /readyz (0: off).")
	flag.StringVar(&o.brokerAddr, "broker-addr", "127.0.0.1:1883", "Listen address of the embedded MQTT v5 broker.")
	flag.StringVar(&o.mosquittoURL, "mosquitto-url", "", "Use this Mosquitto (with the dynamic-security plugin) instead of the embedded broker.")
	flag.StringVar(&o.mosquittoAdmin, "mosquitto-admin", "admin", "Dynsec admin username for --mosquitto-url.")
	flag.StringVar(&o.mosquittoBackend, "mosquitto-backend", brokers.Dynsec, "How --mosquitto-url keeps identities: dynsec (the dynamic-security plugin) or table (the a2a-fleet decision-table plugin).")
	flag.StringVar(&o.mosquittoPassword, "mosquitto-admin-password", os.Getenv("MOSQUITTO_ADMIN_PASSWORD"), "Dynsec admin password for --mosquitto-url (or $MOSQUITTO_ADMIN_PASSWORD).")
	flag.StringVar(&o.samples, "samples", "config/samples", "Apply these manifests at start and run the example agents they name (empty: none).")
	flag.BoolVar(&o.controllerManager, "controller-manager", true, "Run kube-controller-manager (from --assets) for garbage collection, namespace deletion and RBAC aggregation, as on a cluster.")
	flag.StringVar(&o.cardSigningSecret, "card-signing-secret", defaultCardSigningSecret, "NAMESPACE/NAME of the Secret whose keys sign every agent card, created with one new ES256 key when missing, as the installs do; the public keys are retained on $a2a-fleet/v1/card-keys. Empty: cards are published unsigned.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "Print the version and source commit, and exit.")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get().String("devstack"))
		return
	}
	ctrlmetrics.Registry.MustRegister(version.NewCollector())
	ctrl.SetLogger(newLogger(&zapOpts))

	if err := run(signalContext(), o); err != nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}

// newLogger is the one logger of the stack: the operator, the control plane's client (klog), the
// conversation service and the example agents (slog) all write through it, human-readable, at
// Info. An expected event (a broker reconnect, a retried conflict) is one line: stack traces only
// for panics. --zap-log-level=debug shows every reconcile; --zap-stacktrace-level changes the rest.
func newLogger(opts *zap.Options) logr.Logger {
	if opts.StacktraceLevel == nil {
		opts.StacktraceLevel = zapcore.PanicLevel
	}
	if opts.Level == nil {
		opts.Level = zapcore.InfoLevel
	}
	log := zap.New(zap.UseFlagOptions(opts), zap.ConsoleEncoder(func(c *zapcore.EncoderConfig) {
		c.EncodeTime = zapcore.TimeEncoderOfLayout(time.TimeOnly)
	}))
	klog.SetLogger(log)
	slog.SetDefault(slog.New(logr.ToSlogHandler(log)))
	return log
}

// klogWriter sends kube-controller-manager's output to the stack's log at debug level (it is
// chatty at start; --zap-log-level=debug shows it).
type klogWriter struct{}

func (klogWriter) Write(p []byte) (int, error) {
	ctrl.Log.WithName("kube-controller-manager").V(1).Info(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func run(ctx context.Context, o options) error {
	if o.assets == "" {
		return errors.New("no control-plane binaries: pass --assets or set KUBEBUILDER_ASSETS (make dev does this)")
	}
	stateDir, etcdDir, certDir, err := prepareStateDir(o.stateDir)
	if err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(a2av1.AddToScheme(scheme))

	cp, err := startControlPlane(ctx, o, scheme, stateDir, etcdDir, certDir)
	if err != nil {
		return err
	}
	defer cp.stop()
	cfg, kubeconfigPath := cp.cfg, cp.kubeconfigPath

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress: o.probeAddr,
		// Within shutdownBound.
		GracefulShutdownTimeout: ptr.To(5 * time.Second),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	creds, err := startCredentialsProjection(ctx, mgr.GetCache(), filepath.Join(stateDir, "credentials"))
	if err != nil {
		return err
	}
	// As cmd/manager: one caller graph and one Agent count index for the controllers and the
	// Registrar.
	graph, counts := tenancy.NewCallerGraph(), tenancy.NewAgentCounts(mgr.GetCache())
	reader := tenancy.WithAgentCounts(tenancy.WithCallerGraph(mgr.GetClient(), graph), counts)
	broker, brokerURL, stopBroker, err := startBroker(o, stateDir, mgr, reader)
	if err != nil {
		return err
	}
	defer stopBroker()
	copts := controllers.Options{Registrar: broker.Registrar(), AgentResyncs: broker.AgentResyncs(), WorkloadBrokerURL: brokerURL, Gating: true,
		Presence: broker, PresenceEvents: broker.PresenceEvents(), CallerGraph: graph, AgentCounts: counts}
	if o.mosquittoURL != "" {
		copts.PoolsUnsupported = controllers.PoolsUnsupportedOnMosquitto
	}
	copts.Metrics = ctrlmetrics.Registry
	if err := controllers.Setup(ctx, mgr, copts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	// As cmd/manager: unready once the broker has been unreachable for longer than the grace.
	if err := mgr.AddReadyzCheck("readyz", broker.Checker(brokerReadinessGrace)); err != nil {
		return fmt.Errorf("add ready check: %w", err)
	}

	// A client that reads around the manager's cache, for the set-up steps below.
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	// The broker runtime writes the service's Secret, and the card signing Secret, there once the
	// manager runs.
	namespaces := []string{serviceSecret.Namespace}
	if ns, _, _ := strings.Cut(o.cardSigningSecret, "/"); ns != "" && ns != serviceSecret.Namespace {
		namespaces = append(namespaces, ns)
	}
	for _, ns := range namespaces {
		if err := direct.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	if err := installNamespaceOwnerRoles(ctx, direct, o.rbacDir); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(ctx) }()

	svc, err := startConversationService(ctx, direct, o, brokerURL, stateDir, cfg)
	if err != nil {
		return err
	}
	defer svc.Close()
	if o.samples != "" {
		if err := applySamples(ctx, direct, o.samples); err != nil {
			return err
		}
		stopAgents, err := startExampleAgents(ctx, direct, brokerURL, creds, cardStatusIfSigned(broker, o))
		if err != nil {
			return err
		}
		defer stopAgents()
	}

	printBanner(o, cfg.Host, brokerURL, stateDir, kubeconfigPath)

	start := time.Now()
	select {
	case err := <-mgrDone:
		if err != nil {
			return fmt.Errorf("run operator: %w", err)
		}
	case <-ctx.Done():
		<-mgrDone
	}
	fmt.Printf("devstack: stopped after %s\n", time.Since(start).Round(time.Second))
	return nil
}

// devControlPlane is the stack's kube-apiserver and etcd (with kube-controller-manager when
// asked), and the kubeconfig written for the user.
type devControlPlane struct {
	cfg            *rest.Config
	kubeconfigPath string
	// stop stops kube-controller-manager, then the control plane.
	stop func()
}

// startControlPlane starts the control plane on the state dir's etcd data (so Agents and policies
// survive a restart of the stack) and writes the admin's kubeconfig into the state dir.
func startControlPlane(ctx context.Context, o options, scheme *runtime.Scheme, stateDir, etcdDir, certDir string) (*devControlPlane, error) {
	env := &envtest.Environment{
		Scheme:                scheme,
		CRDDirectoryPaths:     []string{o.crdDir},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: o.assets,
		// etcd replaying a state dir on a busy machine takes longer than envtest's 20 s default;
		// a retry would log an ERROR at every restart of the stack.
		ControlPlaneStartTimeout: 2 * time.Minute,
		// Within shutdownBound: SIGTERM, then SIGKILL after this.
		ControlPlaneStopTimeout: 5 * time.Second,
	}
	// A fixed data dir keeps Agents and policies across restarts of the stack.
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: etcdDir}
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir}
	var stopOnce sync.Once
	stopControlPlane := func() {
		stopOnce.Do(func() {
			if err := env.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "devstack: stop control plane:", err)
			}
		})
	}
	// Registered before the start: a signal during a slow start still stops what started.
	onForcedExit(stopControlPlane)
	cfg, err := env.Start()
	if err != nil {
		stopControlPlane()
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	cp := &devControlPlane{cfg: cfg, stop: stopControlPlane}
	fail := func(err error) (*devControlPlane, error) {
		cp.stop()
		return nil, err
	}
	admin, err := env.AddUser(envtest.User{Name: "dev-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fail(fmt.Errorf("create admin user: %w", err))
	}
	if o.controllerManager {
		// What a cluster's controllers do: garbage collection (a deleted Agent's Secret goes with
		// it), namespace deletion, RBAC aggregation (the project's roles in admin/edit/view).
		kcm, err := controlplane.StartControllerManager(ctx, controlplane.ControllerManagerConfig{
			Binary: filepath.Join(o.assets, controlplane.ControllerManagerBinary), Config: admin.Config(), Dir: stateDir,
			Log: klogWriter{},
		})
		if err != nil {
			return fail(fmt.Errorf("start kube-controller-manager (--controller-manager=false runs without: no garbage collection, namespace deletion or RBAC aggregation): %w", err))
		}
		onForcedExit(func() { _ = kcm.Stop() })
		cp.stop = func() {
			_ = kcm.Stop()
			stopControlPlane()
		}
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		return fail(fmt.Errorf("render kubeconfig: %w", err))
	}
	cp.kubeconfigPath = filepath.Join(stateDir, "kubeconfig")
	if err := os.WriteFile(cp.kubeconfigPath, kubeconfig, 0o600); err != nil {
		return fail(fmt.Errorf("write kubeconfig: %w", err))
	}
	return cp, nil
}

// printBanner says where the stack is and what to try first.
func printBanner(o options, apiServer, brokerURL, stateDir, kubeconfigPath string) {
	kubectl := filepath.Join(o.assets, "kubectl")
	brokerKind := "embedded mochi-mqtt, ACLs enforced"
	if o.mosquittoURL != "" {
		brokerKind = "Mosquitto with the dynamic-security plugin"
		if o.mosquittoBackend == brokers.Table {
			brokerKind = "Mosquitto with the a2a-fleet decision-table plugin"
		}
	}
	// a2actl's default broker is the stack's default address: name it only when it differs.
	brokerFlag := ""
	if brokerURL != "mqtt://127.0.0.1:1883" {
		brokerFlag = " --broker " + brokerURL
	}
	cards := "unsigned (--card-signing-secret is empty)"
	if o.cardSigningSecret != "" {
		cards = "signed with the keys of Secret " + o.cardSigningSecret + "; a2actl verifies them against the key set retained on " + a2amqtt.CardKeysTopic
	}
	fmt.Printf(`
a2a-fleet local stack is up:
  control plane %s
  MQTT broker   %s (%s)
  operator, conversation service and the example agents of %s run in this process.
  agent cards   %s
State: %s (delete it to start from scratch). Stop with Ctrl-C.

Try, in another shell:
  export KUBECONFIG=%s
  alias kubectl=%s
  kubectl get agents,conversationpolicies
  kubectl describe agent confirm

Chat with the confirmation agent (it asks "go ahead?" and waits for your answer) as the
samples' console Agent, whose credentials a2actl reads from the Agent's Secret:
  KUBECONFIG=%s bin/a2actl chat --as-agent console%s acme/demo/confirm
List the agents, their presence and whether their cards verify (SIGNATURE):
  KUBECONFIG=%s bin/a2actl agents --as-agent console%s
`, apiServer, brokerURL, brokerKind, o.samples, cards, stateDir, kubeconfigPath, kubectl, kubeconfigPath, brokerFlag, kubeconfigPath, brokerFlag)
}

// prepareStateDir resolves the state dir and readies what the control plane keeps in it: etcd's
// data dir (stopping a control plane an earlier, crashed devstack left on it), and the API
// server's certificate folder and this process's temp dir, made anew.
func prepareStateDir(dir string) (stateDir, etcdDir, certDir string, err error) {
	if stateDir, err = filepath.Abs(dir); err != nil {
		return "", "", "", fmt.Errorf("resolve state dir: %w", err)
	}
	etcdDir = filepath.Join(stateDir, "etcd")
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		return "", "", "", fmt.Errorf("create etcd data dir: %w", err)
	}
	// An etcd an earlier devstack left running holds the data dir: the new one would time out.
	if err := stopStaleControlPlane(etcdDir, stateDir); err != nil {
		return "", "", "", err
	}
	if certDir, err = freshDir(stateDir, "apiserver"); err != nil {
		return "", "", "", err
	}
	// envtest also writes its webhook serving certificates to a temp dir of its own choosing:
	// this process's temp dir is in the state dir too.
	tmpDir, err := freshDir(stateDir, "tmp")
	if err != nil {
		return "", "", "", err
	}
	if err := os.Setenv("TMPDIR", tmpDir); err != nil {
		return "", "", "", fmt.Errorf("set TMPDIR: %w", err)
	}
	return stateDir, etcdDir, certDir, nil
}

// freshDir empties and returns the folder name in the state dir. envtest's defaults for the API
// server's certificates and its webhook certificates are temp dirs removed only by a clean stop,
// so every killed stack left two in /tmp; these are made anew at each start instead.
func freshDir(stateDir, name string) (string, error) {
	dir := filepath.Join(stateDir, name)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("clear %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	return dir, nil
}
