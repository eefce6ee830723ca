package convservice

// The replica's configuration and its defaults.

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"k8s.io/client-go/rest"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Config configures one service replica.
type Config struct {
	// BrokerURL is the MQTT v5 broker (mqtt://host:1883, ...).
	BrokerURL string
	// Username and Password are the service's broker credentials (the
	// Secret EnsureServiceCredentials writes: username a2a:conversation-service).
	Username string
	Password string
	// Credentials, when set, replaces Username and Password (as in a2amqtt.Config): asked at
	// every CONNECT (a mounted Secret, a2amqtt.CredentialsDir), so a password the operator
	// changes is used at the next reconnect, without a restart.
	Credentials a2amqtt.CredentialSource
	// ReplicaID names this replica: its MQTT client id is
	// a2a-fleet/system/conversation-service-{ReplicaID} and agents reply to
	// $a2a/v1/reply/a2a-fleet/system/conversation-service/{ReplicaID}.
	// Must match ^[A-Za-z0-9_.-]+$; defaults to the host name.
	ReplicaID string
	// Store is "bolt:PATH" (one replica, survives restarts) or a Redis URL
	// (several replicas: each owns a share of the gated agents, decides for
	// them from memory and consumes only their request topics;
	// docs/conversation-service.md, "Replicas"): redis://host:port/db, or a
	// Sentinel-managed primary (redis+sentinel://), or a cluster
	// (redis+cluster://), as convstore.ParseRedisURL reads them.
	Store string
	// RedisPrefix namespaces the Redis keys (default "a2af").
	RedisPrefix string
	// BoltNoSync skips fsync on bolt commits (tests and benchmarks only).
	BoltNoSync bool
	// LeaseTTL is how long a replica's ownership of an agent lasts without
	// renewal (Redis; default 15s): a crashed replica's agents move to the
	// others within about this long.
	LeaseTTL time.Duration
	// RestConfig reaches the Kubernetes API (Agents, ConversationPolicies).
	RestConfig *rest.Config
	// Namespace restricts the watch to one namespace ("" = all).
	Namespace string
	// MetricsAddr serves /metrics ("" or "0" = off).
	MetricsAddr string
	// HealthAddr serves /healthz and /readyz ("" or "0" = off).
	HealthAddr string
	// Now is the clock (default time.Now); the engine never reads a clock
	// itself, so tests can move time.
	Now func() time.Time
	// SweepInterval is how often due contexts are expired (default 1s).
	SweepInterval time.Duration
	// StatsInterval is how often the context/task gauges are recomputed
	// from the store (default 15s).
	StatsInterval time.Duration
	// ResyncInterval re-reads the gated agents and retries subscriptions
	// the broker refused (default 10s; changes are also applied on watch
	// events at once).
	ResyncInterval time.Duration
	// Workers is how many goroutines handle requests and replies (default
	// 32). Messages with the same correlation data go to the same worker,
	// so a reply stream keeps its order.
	Workers int
	// RouteSecret keys the AEAD (AES-256-GCM) that seals routes in forwarded
	// correlation data, and derives the replica's MQTT client id; every
	// replica must use the same one. Defaults to Password.
	RouteSecret []byte
	// PreviousRouteSecrets still open routes sealed before a key rotation
	// (docs/conversation-service.md, "Keys").
	PreviousRouteSecrets [][]byte
	// TLS for the broker connection (mqtts://, tls://, wss://): a CA bundle
	// to verify the broker with (default: the system roots) and a client
	// certificate and key for brokers that require one.
	TLSCAFile, TLSCertFile, TLSKeyFile string
	// SessionExpiry keeps the replica's MQTT session on the broker this
	// long after a disconnect (Clean Start false), so replies and requests
	// published while the replica restarts are delivered when it is back
	// (default 10m; negative: clean start on every connection).
	SessionExpiry time.Duration
	// ReadinessGrace is how long the broker connection may be down (an
	// expected reconnect) before /readyz fails (default 10s).
	ReadinessGrace time.Duration
	// HandoverWait bounds how long a request (or reply) for an agent that
	// is assigned to this replica but not yet held by it (a hand-over
	// between replicas, a restart) waits for the agent before it is
	// answered -32004 responder_unavailable (Redis; default 10s).
	HandoverWait time.Duration
	// MaxPayloadBytes rejects larger requests (default 1 MiB).
	MaxPayloadBytes int
	// CallerRate is how many requests per second one caller (the verified
	// publisher) may send to this replica, to all gated agents and the
	// history endpoint together, as a token bucket of CallerBurst; beyond it
	// a request is answered CodeRateLimited with retry_after (ratelimit.go).
	// 0: DefaultCallerRate; negative: no limit.
	CallerRate float64
	// CallerBurst is the bucket's size (0: DefaultCallerBurst).
	CallerBurst int
	// AgentHistoryRate is how many reads of its own conversations' history
	// per second a governed agent may send to this replica, a budget of its
	// own, not charged to CallerRate (ratelimit.go), as a token bucket of
	// AgentHistoryBurst. 0: DefaultAgentHistoryRate; negative: no limit.
	AgentHistoryRate float64
	// AgentHistoryBurst is that bucket's size (0: DefaultAgentHistoryBurst).
	AgentHistoryBurst int
	// TracerProvider receives the service's spans (receive → decide →
	// forward, and relay), which continue the requester's trace from the
	// traceparent user property and propagate it to the agent. Default:
	// none recorded.
	TracerProvider trace.TracerProvider
	// Logger defaults to logr.Discard().
	Logger logr.Logger
	// Registry receives the metrics (default: a new registry, served on
	// MetricsAddr).
	Registry *prometheus.Registry
}

// defaults checks what is required and fills in what is not set, in named steps.
func (c *Config) defaults() error {
	if err := c.requireSettings(); err != nil {
		return err
	}
	c.defaultIntervals()
	c.defaultLimits()
	if err := c.defaultRouteSecret(); err != nil {
		return err
	}
	c.defaultPlumbing()
	return nil
}

// requireSettings checks the settings without a default (and defaults the replica id to the
// host name).
func (c *Config) requireSettings() error {
	if c.ReplicaID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("default replica id from host name: %w", err)
		}
		c.ReplicaID = h
	}
	if !a2amqtt.ValidID(c.ReplicaID) {
		return fmt.Errorf("replica id %q must match ^[A-Za-z0-9_.-]+$", c.ReplicaID)
	}
	if c.BrokerURL == "" {
		return errors.New("broker URL is required")
	}
	if c.RestConfig == nil {
		return errors.New("kubernetes rest config is required")
	}
	if c.Store == "" {
		return errors.New("store is required (bolt:PATH, redis://..., redis+sentinel://... or redis+cluster://...)")
	}
	return nil
}

// defaultIntervals sets the clock and the durations left unset.
func (c *Config) defaultIntervals() {
	if c.Now == nil {
		c.Now = time.Now
	}
	orDefault(&c.SweepInterval, time.Second)
	orDefault(&c.StatsInterval, 15*time.Second)
	orDefault(&c.ResyncInterval, 10*time.Second)
	orDefault(&c.LeaseTTL, 15*time.Second)
	if c.SessionExpiry == 0 {
		c.SessionExpiry = 10 * time.Minute // negative: clean start
	}
	orDefault(&c.ReadinessGrace, 10*time.Second)
	orDefault(&c.HandoverWait, 10*time.Second)
}

// defaultLimits sets the worker count, the payload bound and the rate limits left unset
// (a negative rate means no limit and is kept).
func (c *Config) defaultLimits() {
	orDefault(&c.Workers, 32)
	orDefault(&c.MaxPayloadBytes, 1<<20)
	if c.CallerRate == 0 {
		c.CallerRate = DefaultCallerRate
	}
	orDefault(&c.CallerBurst, DefaultCallerBurst)
	if c.AgentHistoryRate == 0 {
		c.AgentHistoryRate = DefaultAgentHistoryRate
	}
	orDefault(&c.AgentHistoryBurst, DefaultAgentHistoryBurst)
}

// defaultRouteSecret keys the routes with the password at the start when no route secret is set.
func (c *Config) defaultRouteSecret() error {
	if c.RouteSecret != nil {
		return nil
	}
	c.RouteSecret = []byte(c.Password)
	if c.Credentials != nil {
		// The password at the start keys the routes; a rotated one must not change the key
		// under the routes in flight (--route-secret-file decouples them).
		_, pass, err := c.Credentials.Credentials()
		if err != nil {
			return fmt.Errorf("read the credentials for the default route secret: %w", err)
		}
		c.RouteSecret = pass
	}
	return nil
}

// defaultPlumbing sets the Redis prefix, the logger, the tracer provider and the metrics
// registry left unset.
func (c *Config) defaultPlumbing() {
	if c.RedisPrefix == "" {
		c.RedisPrefix = "a2af"
	}
	if c.Logger.GetSink() == nil {
		c.Logger = logr.Discard()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
}

// orDefault sets *v to def when it is zero or negative.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
