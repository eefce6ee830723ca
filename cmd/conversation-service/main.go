// Command conversation-service runs one replica of the conversation service
// (internal/convservice): the A2A-over-MQTT reverse proxy that enforces
// ConversationPolicies in front of gated agents.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/version"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func env(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func main() {
	var cfg convservice.Config
	flag.StringVar(&cfg.BrokerURL, "broker", env("A2A_BROKER", "mqtt://127.0.0.1:1883"), "MQTT v5 broker URL (env A2A_BROKER)")
	flag.StringVar(&cfg.Username, "username", env("A2A_USERNAME", "a2a:conversation-service"), "broker username (env A2A_USERNAME, from the service Secret)")
	var credentialsDir string
	flag.StringVar(&credentialsDir, "credentials-dir", env(a2amqtt.EnvCredentialsDir, ""),
		"folder with the files username and password (the service Secret mounted as a volume), read at every CONNECT so a new password is used without a restart; overrides --username and A2A_PASSWORD (env "+a2amqtt.EnvCredentialsDir+")")
	flag.StringVar(&cfg.ReplicaID, "replica-id", env("A2A_REPLICA_ID", ""), "replica id: MQTT client id suffix and reply topic suffix (default: host name)")
	flag.StringVar(&cfg.Store, "store", env("A2A_STORE", "bolt:/var/lib/conversation-service/state.db"), "state store: bolt:PATH (one replica), or for several: redis://[user:pass@]host:port/db, "+
		"redis+sentinel://[user:pass@]sentinel:port/db?addr=sentinel2:port&master_name=NAME (a Sentinel-managed primary; commits wait for wait_replicas=1 replica by default), "+
		"redis+cluster://node:port?addr=node2:port (rediss... with TLS; the password may come from env A2A_REDIS_PASSWORD; docs/conversation-service.md, \"Replicated Redis\")")
	flag.StringVar(&cfg.RedisPrefix, "redis-prefix", "a2af", "key prefix in Redis")
	// Deprecated: replicas partition the agents between them (ownership in
	// the Redis journal), on every broker; accepted so old manifests run.
	flag.Bool("shared-subscriptions", false, "deprecated, ignored: replicas partition the gated agents between them")
	flag.DurationVar(&cfg.LeaseTTL, "lease-ttl", 15*time.Second, "Redis: how long a replica owns an agent without renewing (a crashed replica's agents move after about this long)")
	flag.DurationVar(&cfg.SessionExpiry, "session-expiry", 10*time.Minute, "MQTT session kept by the broker across a restart of this replica (negative: clean start)")
	flag.DurationVar(&cfg.ReadinessGrace, "readiness-grace", 10*time.Second, "how long the broker connection may be down before /readyz fails")
	flag.StringVar(&cfg.Namespace, "namespace", env("A2A_WATCH_NAMESPACE", ""), "watch Agents and ConversationPolicies in this namespace only (default: all)")
	flag.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":8080", "address of /metrics (0 disables)")
	flag.StringVar(&cfg.HealthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 disables)")
	flag.DurationVar(&cfg.SweepInterval, "sweep-interval", time.Second, "how often expired contexts and input-required timeouts are applied")
	flag.IntVar(&cfg.Workers, "workers", 32, "goroutines handling requests and replies")
	flag.Float64Var(&cfg.CallerRate, "caller-rate", convservice.DefaultCallerRate,
		"requests per second one caller may send to this replica (token bucket; beyond it: error -32070 with retry_after); negative: no limit")
	flag.IntVar(&cfg.CallerBurst, "caller-burst", convservice.DefaultCallerBurst, "the caller rate's burst (bucket size)")
	flag.Float64Var(&cfg.AgentHistoryRate, "agent-history-rate", convservice.DefaultAgentHistoryRate,
		"reads of its own conversations' history per second a governed agent may send to this replica, a budget of their own (not charged to --caller-rate); negative: no limit")
	flag.IntVar(&cfg.AgentHistoryBurst, "agent-history-burst", convservice.DefaultAgentHistoryBurst, "the agent history rate's burst (bucket size)")
	var routeSecretFile, previousSecretFile string
	flag.StringVar(&routeSecretFile, "route-secret-file", env("A2A_ROUTE_SECRET_FILE", ""),
		"file holding the secret that encrypts routes in forwarded correlation data and derives the replica's client id; the same on every replica (default: the broker password)")
	flag.StringVar(&previousSecretFile, "previous-route-secret-file", env("A2A_PREVIOUS_ROUTE_SECRET_FILE", ""),
		"file holding the route secret before a rotation: routes sealed with it are still opened")
	flag.StringVar(&cfg.TLSCAFile, "tls-ca-file", env("A2A_TLS_CA_FILE", ""), "PEM CA bundle to verify the broker's certificate (mqtts://, tls://, wss://); default: system roots")
	flag.StringVar(&cfg.TLSCertFile, "tls-cert-file", env("A2A_TLS_CERT_FILE", ""), "PEM client certificate for the broker connection")
	flag.StringVar(&cfg.TLSKeyFile, "tls-key-file", env("A2A_TLS_KEY_FILE", ""), "PEM key of --tls-cert-file")
	// Deprecated: the service always requires the broker's sender stamp (the
	// embedded broker's, or the sender-stamp plugin's on Mosquitto).
	flag.Bool("require-sender-property", true, "deprecated, ignored: requests the broker did not stamp with their publisher are always dropped")
	// --kubeconfig is controller-runtime's flag (ctrl.GetConfig): that file,
	// else $KUBECONFIG, else in-cluster config.
	zopts := zap.Options{}
	zopts.BindFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "print the version and source commit, and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get().String("conversation-service"))
		return
	}
	cfg.Registry = prometheus.NewRegistry()
	cfg.Registry.MustRegister(version.NewCollector())
	log := zap.New(zap.UseFlagOptions(&zopts))
	ctrl.SetLogger(log)
	cfg.Logger = log
	cfg.Password = os.Getenv("A2A_PASSWORD")
	if credentialsDir != "" {
		// The files are read at every CONNECT (and once for the default route secret).
		cfg.Username, cfg.Password, cfg.Credentials = "", "", a2amqtt.CredentialsDir(credentialsDir)
	}
	// The Redis password comes from a Secret, not the command line (the chart's
	// conversationService.redis.passwordSecret): into the store URL, escaped.
	if pw := os.Getenv("A2A_REDIS_PASSWORD"); pw != "" {
		store, err := convstore.WithRedisPassword(cfg.Store, pw)
		if err != nil {
			fmt.Fprintln(os.Stderr, "conversation-service:", err)
			os.Exit(2)
		}
		cfg.Store = store
	}
	for _, f := range []struct {
		path string
		dst  func([]byte)
	}{
		{routeSecretFile, func(b []byte) { cfg.RouteSecret = b }},
		{previousSecretFile, func(b []byte) { cfg.PreviousRouteSecrets = [][]byte{b} }},
	} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "conversation-service:", err)
			os.Exit(2)
		}
		f.dst(bytes.TrimSpace(b))
	}

	var err error
	if cfg.RestConfig, err = ctrl.GetConfig(); err != nil {
		fmt.Fprintln(os.Stderr, "conversation-service: kubernetes config:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if tp, err := tracerProvider(ctx); err != nil {
		log.Error(err, "tracing exporter")
		os.Exit(2)
	} else if tp != nil {
		cfg.TracerProvider = tp
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tp.Shutdown(sctx)
		}()
	}
	if err := convservice.Run(ctx, cfg); err != nil {
		log.Error(err, "conversation service failed")
		stop()
		os.Exit(1)
	}
}

// tracerProvider exports spans over OTLP/HTTP when the standard OpenTelemetry
// environment names an endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, plus the exporter's other OTEL_*
// variables); otherwise tracing is off (nil).
func tracerProvider(ctx context.Context) (*sdktrace.TracerProvider, error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", "a2a-fleet-conversation-service")))
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
