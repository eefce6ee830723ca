// Package agents holds the example A2A-over-MQTT agents (echo, confirm,
// memory) as a library, so tests run them in-process and the thin main
// packages under examples/ run them as programs.
package agents

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/telemetry"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Kind names an example agent.
type Kind string

// The example agents.
const (
	KindEcho    Kind = "echo"
	KindConfirm Kind = "confirm"
	KindMemory  Kind = "memory"
)

// Options configures an example agent process.
type Options struct {
	BrokerURL string
	Username  string
	Password  string
	// Credentials, when set, replaces Username and Password (a2amqtt.Config.Credentials): a
	// credentials folder (the mounted Secret, A2A_CREDENTIALS_DIR) read at every CONNECT, so the
	// agent survives a rotation of its password.
	Credentials a2amqtt.CredentialSource
	Agent       a2amqtt.AgentRef
	// Pools to join (shared subscription), in the agent's org/unit.
	Pools []string
	// RequestTopic overrides the request topic (the delivery topic behind the conversation service).
	RequestTopic string
	Logger       *slog.Logger
	// Delay slows each execution down (demos and concurrency tests).
	Delay time.Duration
	// ReferenceHandler serves with a2a-go's default request handler instead of the SDK's
	// direct handler (the default; a2amqtt.ResponderOptions.ReferenceHandler).
	ReferenceHandler bool
	// Direct has no effect: the direct handler is the default (see ReferenceHandler). Kept so
	// existing callers compile.
	Direct bool
	// TLS names the PEM files for a TLS broker URL (mqtts://).
	TLS a2amqtt.TLSFiles
	// SessionExpiry > 0 keeps a persistent MQTT session, so requests published while the
	// agent restarts are delivered to the next process (a2amqtt.Config.SessionExpiry).
	SessionExpiry time.Duration
	// HealthAddr, when set, serves /healthz and /readyz there (a2amqtt.ServeHealth), with
	// HealthGrace (default a2amqtt.DefaultHealthGrace) as the reconnect grace.
	HealthAddr  string
	HealthGrace time.Duration
	// HistoryFrom is where the memory agent fetches a conversation's earlier turns
	// (a2amqtt.ResponderOptions.HistoryFrom): the conversation service for a governed agent whose
	// policy keeps message content (history mode Messages). Unset: the agent's own task store.
	HistoryFrom *a2amqtt.AgentRef
	// Card, when set, is the card the agent publishes with its presence instead of its built-in
	// one (Card): the Agent manifest's card as the operator builds it, so that the broker shows
	// one card per agent whoever published last (docs/api.md, "Which card is the agent's").
	Card *a2a.AgentCard
	// CardPublisher says who publishes Card (a2amqtt.Config.CardPublisher): an in-process host
	// whose operator signs cards (the dev stack) sets a2amqtt.CardPublisherOperator, so that the
	// agent's own unsigned copy never replaces the signed card.
	CardPublisher a2amqtt.CardPublisher
	// History is the responder's history policy (a2amqtt.ResponderOptions.History).
	History a2amqtt.HistoryPolicy
	// DrainTimeout bounds the graceful stop of Run (SIGTERM): how long requests in flight may
	// take to finish and be answered before the agent disconnects (default DefaultDrainTimeout).
	DrainTimeout time.Duration
}

// DefaultDrainTimeout is Run's drain bound: below Kubernetes' default
// terminationGracePeriodSeconds (30 s), leaving time for the offline card and DISCONNECT.
const DefaultDrainTimeout = 25 * time.Second

// closeTimeout bounds the offline card and DISCONNECT after the drain.
const closeTimeout = 5 * time.Second

// Executor returns the executor for kind.
func Executor(kind Kind, delay time.Duration) (a2asrv.AgentExecutor, error) {
	switch kind {
	case KindEcho:
		return &Echo{Delay: delay}, nil
	case KindConfirm:
		return &Confirm{Delay: delay}, nil
	case KindMemory:
		return &Memory{Delay: delay}, nil
	}
	return nil, fmt.Errorf("unknown agent kind %q (want echo, confirm or memory)", kind)
}

// GovernedHistory is where an example agent of kind reads a conversation's earlier turns when it
// reads its requests from requestTopic: a governed memory agent (one that reads the delivery topic
// the operator assigned behind the conversation service) reads them from the service, which keeps
// them durably (with content when the policy's history mode is Messages; otherwise InputsOf falls
// back to the agent's own task store); nil (the own task store) otherwise.
func GovernedHistory(kind Kind, requestTopic string) *a2amqtt.AgentRef {
	if kind != KindMemory || requestTopic == "" {
		return nil
	}
	h := identity.Service
	return &h
}

// Card describes the example agent for its retained discovery card.
func Card(kind Kind, brokerURL string, ref a2amqtt.AgentRef) *a2a.AgentCard {
	skill := a2a.AgentSkill{ID: string(kind), Name: string(kind), Tags: []string{"example"}}
	desc := ""
	switch kind {
	case KindEcho:
		desc = "Echoes every message back."
		skill.Description = "Repeats the user's text."
	case KindConfirm:
		desc = "Plans a task, asks for confirmation (input-required) and completes only after 'go ahead'."
		skill.Description = "Confirmation-gated execution."
	case KindMemory:
		desc = "Answers using earlier turns of the same conversation (context id); asks follow-up questions for reminders."
		skill.Description = "Multi-turn conversation with memory."
	}
	card := &a2a.AgentCard{
		Name:                ref.Agent,
		Description:         desc,
		Version:             "0.1.0",
		SupportedInterfaces: []*a2a.AgentInterface{a2amqtt.AgentInterface(brokerURL, ref)},
		Capabilities:        a2a.AgentCapabilities{Streaming: true},
		DefaultInputModes:   []string{"text/plain"},
		DefaultOutputModes:  []string{"text/plain"},
		Skills:              []a2a.AgentSkill{skill},
	}
	if kind != KindEcho {
		// confirm and memory pause with continuation hints.
		a2amqtt.DeclareContinuation(card)
	}
	return card
}

// Agent is a running example agent.
type Agent struct {
	Conn      *a2amqtt.Conn
	Responder *a2amqtt.Responder
	// HealthAddr is where /healthz and /readyz are served (nil without Options.HealthAddr).
	HealthAddr net.Addr
	stopHealth context.CancelFunc
}

// Start connects the agent (presence on) and serves requests until Close.
func Start(ctx context.Context, kind Kind, opts Options) (*Agent, error) {
	exec, err := Executor(kind, opts.Delay)
	if err != nil {
		return nil, err
	}
	card := opts.Card
	if card == nil {
		card = Card(kind, opts.BrokerURL, opts.Agent)
	}
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{
		BrokerURL:     opts.BrokerURL,
		Username:      opts.Username,
		Password:      opts.Password,
		Credentials:   opts.Credentials,
		Agent:         opts.Agent,
		Card:          card,
		CardPublisher: opts.CardPublisher,
		TLSFiles:      opts.TLS,
		SessionExpiry: opts.SessionExpiry,
		Logger:        opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{
		Executor: exec, Pools: opts.Pools, ReferenceHandler: opts.ReferenceHandler, RequestTopic: opts.RequestTopic,
		History: opts.History, HistoryFrom: opts.HistoryFrom,
	})
	if err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	a := &Agent{Conn: conn, Responder: resp}
	if opts.HealthAddr != "" {
		hctx, stop := context.WithCancel(context.Background())
		a.stopHealth = stop
		if a.HealthAddr, err = a2amqtt.ServeHealth(hctx, opts.HealthAddr, conn, opts.HealthGrace); err != nil {
			stop()
			_ = a.Close(ctx)
			return nil, err
		}
	}
	return a, nil
}

// Close stops serving, publishes the offline card and disconnects. It is Shutdown.
func (a *Agent) Close(ctx context.Context) error { return a.Shutdown(ctx) }

// Shutdown is the graceful stop: the responder stops taking requests and finishes the ones in
// flight, publishing their replies (a2amqtt.Responder.Shutdown, bounded by ctx); then the
// connection publishes the offline card and disconnects, within closeTimeout of its own so a
// drain that used the whole bound still says goodbye. With a persistent session, requests that
// arrive meanwhile stay in the session for the next process.
func (a *Agent) Shutdown(ctx context.Context) error {
	if a.stopHealth != nil {
		a.stopHealth()
	}
	drainErr := a.Responder.Shutdown(ctx)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	return errors.Join(drainErr, a.Conn.Close(cctx))
}

// Run starts the agent and blocks until ctx ends (SIGTERM in Main), then stops gracefully:
// requests in flight are finished and answered within opts.DrainTimeout before it disconnects.
func Run(ctx context.Context, kind Kind, opts Options) error {
	a, err := Start(ctx, kind, opts)
	if err != nil {
		return err
	}
	<-ctx.Done()
	drain := opts.DrainTimeout
	if drain <= 0 {
		drain = DefaultDrainTimeout
	}
	log := a.Conn.Logger()
	log.Info("stopping: draining requests in flight", "bound", drain.String())
	start := time.Now()
	dctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	err = a.Shutdown(dctx)
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
	return err
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Main is the body of the example main packages: flags (with A2A_* env
// fallbacks), signal handling, Run.
func Main(kind Kind) {
	fs := flag.NewFlagSet(string(kind), flag.ExitOnError)
	broker := fs.String("broker", envOr("A2A_BROKER", "mqtt://127.0.0.1:1883"), "MQTT v5 broker URL (env A2A_BROKER)")
	org := fs.String("org", envOr("A2A_ORG", "demo"), "org id (env A2A_ORG)")
	unit := fs.String("unit", envOr("A2A_UNIT", "default"), "unit id (env A2A_UNIT)")
	agent := fs.String("agent", envOr("A2A_AGENT", string(kind)), "agent id (env A2A_AGENT)")
	user := fs.String("username", envOr("A2A_USERNAME", ""), "broker username (env A2A_USERNAME)")
	pass := fs.String("password", envOr("A2A_PASSWORD", ""), "broker password (env A2A_PASSWORD)")
	credsDir := fs.String("credentials-dir", envOr(a2amqtt.EnvCredentialsDir, ""), "folder with the files username and password (the mounted credentials Secret), read at every connect so a rotated password is picked up; replaces --username and --password (env "+a2amqtt.EnvCredentialsDir+", set by the operator in workloads)")
	pools := fs.String("pool", envOr("A2A_POOLS", ""), "comma-separated pool ids to join (env A2A_POOLS)")
	requestTopic := fs.String("request-topic", envOr("A2A_REQUEST_TOPIC", ""), "read requests here instead of the public request topic (env A2A_REQUEST_TOPIC, set by the operator)")
	delay := fs.Duration("delay", 0, "artificial processing delay per request")
	reference := fs.Bool("reference-handler", false, "serve with a2a-go's default request handler instead of the SDK's direct handler (the default)")
	_ = fs.Bool("direct", true, "deprecated: the SDK's direct handler is the default")
	tlsCA := fs.String("tls-ca", os.Getenv(a2amqtt.EnvTLSCA), "PEM CA bundle that signs the broker's certificate, for mqtts:// (env "+a2amqtt.EnvTLSCA+")")
	tlsCert := fs.String("tls-cert", os.Getenv(a2amqtt.EnvTLSCert), "PEM client certificate for mqtts:// (env "+a2amqtt.EnvTLSCert+")")
	tlsKey := fs.String("tls-key", os.Getenv(a2amqtt.EnvTLSKey), "PEM key of the client certificate (env "+a2amqtt.EnvTLSKey+")")
	sessionDefault, err := durationEnv("A2A_SESSION_EXPIRY")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", kind, err)
		os.Exit(2)
	}
	if os.Getenv("A2A_SESSION_EXPIRY") == "" {
		sessionDefault = a2amqtt.DefaultAgentSessionExpiry // unset or empty; "0" asks for a clean session
	}
	drainDefault, err := durationEnv("A2A_DRAIN_TIMEOUT")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", kind, err)
		os.Exit(2)
	}
	if drainDefault == 0 {
		drainDefault = DefaultDrainTimeout
	}
	drainTimeout := fs.Duration("drain-timeout", drainDefault, "on SIGTERM, how long requests in flight may take to finish and be answered before the agent disconnects (env A2A_DRAIN_TIMEOUT; keep it below the pod's terminationGracePeriodSeconds)")
	sessionExpiry := fs.Duration("session-expiry", sessionDefault, "keep a persistent MQTT session for this long, so requests sent while the agent is away (a restart, a credentials rotation) are delivered (env A2A_SESSION_EXPIRY; 0 = clean session)")
	healthAddr := fs.String("health-addr", envOr("A2A_HEALTH_ADDR", ""), "serve /healthz and /readyz here, e.g. :8081 (env A2A_HEALTH_ADDR)")
	healthGrace := fs.Duration("health-grace", a2amqtt.DefaultHealthGrace, "how long the broker connection may be down before /readyz fails")
	historyFrom := fs.String("history-from", envOr("A2A_HISTORY_FROM", ""), "ORG/UNIT/AGENT that serves conversation history with ListTasks (env A2A_HISTORY_FROM; default: the conversation service when --request-topic is set, else the agent's own task store; \"self\" forces the own store)")
	verbose := fs.Bool("v", false, "debug logging")
	_ = fs.Parse(os.Args[1:])

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ref := a2amqtt.AgentRef{Org: *org, Unit: *unit, Agent: *agent}
	if err := ref.Validate(); err != nil {
		logger.Error("invalid identity", "err", err)
		os.Exit(2)
	}
	var history *a2amqtt.AgentRef
	switch {
	case *historyFrom == "self":
	case *historyFrom != "":
		h, err := a2amqtt.ParseAgentRef(*historyFrom)
		if err != nil {
			logger.Error("invalid --history-from", "err", err)
			os.Exit(2)
		}
		history = &h
	default:
		history = GovernedHistory(kind, *requestTopic)
	}
	var poolIDs []string
	for _, p := range strings.Split(*pools, ",") {
		if p = strings.TrimSpace(p); p != "" {
			poolIDs = append(poolIDs, p)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal the agent drains; a second one kills it at once.
		<-ctx.Done()
		stop()
	}()
	shutdownTracing, err := telemetry.Setup(ctx, string(kind)+"-agent")
	if err != nil {
		logger.Error("tracing setup failed", "err", err)
		os.Exit(2)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdownTracing(sctx)
	}()
	logger.Info("starting example agent", "kind", kind, "agent", ref.String(), "broker", *broker, "pools", poolIDs, "credentials_dir", *credsDir)
	var creds a2amqtt.CredentialSource
	if *credsDir != "" {
		creds, *user, *pass = a2amqtt.CredentialsDir(*credsDir), "", ""
	}
	// Under the operator, the Agent manifest's card (A2A_AGENT_CARD) is the agent's; the operator
	// publishes it (signed, with the broker's presence) and the Conn leaves it alone
	// (a2amqtt.CardPublisherAuto). Without it, the example publishes its own card.
	card, err := a2amqtt.AgentCardFromEnv()
	if err != nil {
		logger.Error("invalid agent card", "err", err)
		os.Exit(2)
	}
	opts := Options{
		BrokerURL: *broker, Username: *user, Password: *pass, Credentials: creds, Agent: ref, Pools: poolIDs, Logger: logger, Card: card,
		Delay: *delay, ReferenceHandler: *reference, RequestTopic: *requestTopic,
		TLS:           a2amqtt.TLSFiles{CA: *tlsCA, Cert: *tlsCert, Key: *tlsKey},
		SessionExpiry: *sessionExpiry, HealthAddr: *healthAddr, HealthGrace: *healthGrace,
		HistoryFrom: history, DrainTimeout: *drainTimeout,
	}
	if err := Run(ctx, kind, opts); err != nil {
		logger.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}

// durationEnv parses a duration from the environment (0 when unset).
func durationEnv(key string) (time.Duration, error) {
	v := os.Getenv(key)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", key, v, err)
	}
	return d, nil
}
