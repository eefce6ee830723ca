package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/version"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Exit codes, so scripts can tell failure kinds apart.
const (
	exitOK          = 0
	exitFailure     = 1 // agent answered with an error, or a task failed
	exitUsage       = 2
	exitUnreachable = 3 // broker unreachable
	exitOffline     = 4 // agent not registered / nobody serving it
	exitTimeout     = 5
)

const usageHead = `a2actl - talk to A2A agents over MQTT (A2A over MQTT profile v0.1)

Usage:
`

const usageGlobals = `
Global flags (anywhere on the line):
  --broker URL        MQTT v5 broker (env A2A_BROKER, default mqtt://127.0.0.1:1883)
  --as-agent NAME     act as the Agent NAME of the current kubeconfig context: its username,
                      password and client ID are read from the Agent's credentials Secret (env
                      A2A_AS_AGENT); replaces --username, --password and --as
  -n NAMESPACE        the namespace of --as-agent (default: the kubeconfig context's)
  --kubeconfig FILE   kubeconfig for --as-agent (default: KUBECONFIG, then ~/.kube/config)
  --username NAME     broker username (env A2A_USERNAME)
  --password PASS     broker password (env A2A_PASSWORD)
  --credentials-dir D folder with the files username, password and clientID (the Agent's
                      credentials Secret, e.g. mounted, or written by kubectl): read at every
                      connect, so a long chat survives a rotation; replaces --username and
                      --password, and clientID is the default --as (env A2A_CREDENTIALS_DIR)
  --as ORG/UNIT/ID    own identity / MQTT Client ID (default target org/unit + a2actl-<random>;
                      env A2A_AS)
  --tls-ca FILE       PEM CA bundle of the broker, for mqtts:// URLs (env A2A_TLS_CA)
  --tls-cert FILE     PEM client certificate (env A2A_TLS_CERT)
  --tls-key FILE      PEM key of the client certificate (env A2A_TLS_KEY)
  --card-keys FILE    JWK Set or single JWK (a pinned key) that signs agent cards (env
                      A2A_CARD_KEYS): send and chat refuse an agent whose card does not
                      verify; agents and card verify default to the key set the operator
                      retains on $a2a-fleet/v1/card-keys, when there is one
  --timeout DUR       first-reply timeout per attempt (default 15s, the profile's)
  --presence-wait DUR how long to wait for the agent's retained card before calling it
                      not registered (default 5s: an agent reconnecting after a broker
                      restart republishes it within its reconnect backoff)
  --attempts N        publish attempts (default 3)
  --json              machine-readable output
  -v                  debug logging

Exit codes: 0 ok, 1 error reply / failed task, 2 usage (or TLS settings, or --as-agent's Agent
or Secret not readable), 3 broker unreachable, 4 agent not registered or offline, 5 timeout.
"a2actl COMMAND -h" shows a command's synopsis, an example and the variables it reads.
`

// usage is the top-level help: every command's synopsis, then the global flags.
func usage() string {
	var b strings.Builder
	b.WriteString(usageHead)
	for _, cmd := range commands() {
		fmt.Fprintf(&b, "  a2actl %-39s %s\n", cmd.synopsis, cmd.summary)
	}
	b.WriteString(usageGlobals)
	return b.String()
}

// connectionEnv are the variables every command that connects reads.
var connectionEnv = []string{
	"A2A_BROKER", "A2A_AS_AGENT", "KUBECONFIG", "A2A_USERNAME", "A2A_PASSWORD", a2amqtt.EnvCredentialsDir,
	"A2A_AS", a2amqtt.EnvTLSCA, a2amqtt.EnvTLSCert, a2amqtt.EnvTLSKey, a2amqtt.EnvCardKeys, "OTEL_EXPORTER_OTLP_ENDPOINT",
}

type globals struct {
	broker     string
	username   string
	password   string
	credsDir   string
	asAgent    string
	namespace  string
	kubeconfig string
	tls        a2amqtt.TLSFiles
	cardKeys   string
	as         string
	timeout    time.Duration
	presence   time.Duration
	attempts   int
	json       bool
	verbose    bool
	// brokerGiven is whether --broker or A2A_BROKER named the broker (an Agent's Secret that
	// carries a broker URL is used only when neither does).
	brokerGiven bool
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.broker, "broker", envOr("A2A_BROKER", defaultBroker), "MQTT v5 broker URL")
	fs.StringVar(&g.asAgent, "as-agent", envOr(envAsAgent, ""), "act as this Agent (credentials from its Secret, through the kubeconfig)")
	fs.StringVar(&g.namespace, "n", "", "namespace of --as-agent (default: the kubeconfig context's)")
	fs.StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig for --as-agent (default: KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&g.username, "username", envOr("A2A_USERNAME", ""), "broker username")
	fs.StringVar(&g.password, "password", envOr("A2A_PASSWORD", ""), "broker password")
	fs.StringVar(&g.credsDir, "credentials-dir", envOr(a2amqtt.EnvCredentialsDir, ""), "credentials folder (username, password, clientID)")
	fs.StringVar(&g.as, "as", envOr("A2A_AS", ""), "own identity ORG/UNIT/AGENT")
	fs.StringVar(&g.cardKeys, "card-keys", envOr(a2amqtt.EnvCardKeys, ""), "JWK Set or JWK file of the keys that sign agent cards")
	fs.StringVar(&g.tls.CA, "tls-ca", envOr(a2amqtt.EnvTLSCA, ""), "PEM CA bundle of the broker (mqtts://)")
	fs.StringVar(&g.tls.Cert, "tls-cert", envOr(a2amqtt.EnvTLSCert, ""), "PEM client certificate")
	fs.StringVar(&g.tls.Key, "tls-key", envOr(a2amqtt.EnvTLSKey, ""), "PEM key of the client certificate")
	fs.DurationVar(&g.timeout, "timeout", 15*time.Second, "first-reply timeout per attempt")
	fs.DurationVar(&g.presence, "presence-wait", defaultPresenceWait, "how long to wait for the agent's retained card")
	fs.IntVar(&g.attempts, "attempts", 3, "publish attempts")
	fs.BoolVar(&g.json, "json", false, "JSON output")
	fs.BoolVar(&g.verbose, "v", false, "debug logging")
}

// defaultBroker is `make dev`'s broker.
const defaultBroker = "mqtt://127.0.0.1:1883"

// commandIndex finds the command word, skipping global flags and their values.
func commandIndex(args []string) int {
	boolFlags := map[string]bool{"json": true, "v": true, "stream": true, "approve": true, "deny": true, "h": true, "help": true}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return i
		}
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") || boolFlags[name] {
			continue
		}
		i++ // skip the flag's value
	}
	return -1
}

// parseInterspersed lets flags follow positional arguments, which the
// standard flag package does not ("send X text --json").
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

type cli struct {
	g globals
	// agentCreds are --as-agent's, once read.
	agentCreds *agentCredentials
	stdin      io.Reader
	stdout     io.Writer
	stderr     io.Writer
	log        *slog.Logger
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if code, done := topLevel(args, stdout); done {
		return code
	}
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	// Global flags may come before the command too: the command is the first word that is not
	// a flag or a flag's value.
	cmdAt := commandIndex(args)
	if cmdAt < 0 {
		fmt.Fprintf(stderr, "a2actl: no command\n\n%s", usage())
		return exitUsage
	}
	cmd, ok := commandNamed(args[cmdAt])
	if !ok {
		fmt.Fprintf(stderr, "a2actl: unknown command %q\n\n%s", args[cmdAt], usage())
		return exitUsage
	}
	rest := append(append([]string{}, args[:cmdAt]...), args[cmdAt+1:]...)
	if wantsHelp(rest) {
		fmt.Fprint(stdout, cmd.help())
		return exitOK
	}
	fs := flag.NewFlagSet("a2actl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.g.register(fs)
	var o options
	if cmd.flags != nil {
		cmd.flags(fs, &o)
	}
	pos, err := parseInterspersed(fs, rest)
	if err != nil {
		fmt.Fprintf(stderr, "a2actl %s: %v\n\n%s", cmd.name, err, cmd.help())
		return exitUsage
	}
	c.g.brokerGiven = os.Getenv("A2A_BROKER") != ""
	fs.Visit(func(f *flag.Flag) { c.g.brokerGiven = c.g.brokerGiven || f.Name == "broker" })
	level := slog.LevelWarn
	if c.g.verbose {
		level = slog.LevelDebug
	}
	c.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return cmd.run(c, ctx, &o, pos)
}

// topLevel answers what needs no command: help (-h, --help, help; nothing at all is a usage
// error) and --version.
func topLevel(args []string, stdout io.Writer) (code int, done bool) {
	switch {
	case len(args) == 0:
		fmt.Fprint(stdout, usage())
		return exitUsage, true
	case args[0] == "-h" || args[0] == "--help" || (args[0] == "help" && len(args) == 1):
		fmt.Fprint(stdout, usage())
		return exitOK, true
	case args[0] == "help":
		// "a2actl help send" is "a2actl send -h".
		if cmd, ok := commandNamed(args[1]); ok {
			fmt.Fprint(stdout, cmd.help())
			return exitOK, true
		}
		fmt.Fprint(stdout, usage())
		return exitUsage, true
	case args[0] == "--version":
		fmt.Fprintln(stdout, version.Get().String("a2actl"))
		return exitOK, true
	}
	return 0, false
}

// wantsHelp reports whether a command's arguments ask for its help.
func wantsHelp(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "-help" || a == "--help" })
}

func (c *cli) usageErr(msg string) int {
	fmt.Fprintf(c.stderr, "a2actl: %s\n\n%s", msg, usage())
	return exitUsage
}

// identity is --as, or a fresh a2actl-<random> in the target's org/unit
// (the profile fixes Client IDs to {org}/{unit}/{agent}; a random agent id
// keeps two a2actl runs from kicking each other off the broker).
func (c *cli) identity(target a2amqtt.AgentRef) (a2amqtt.AgentRef, error) {
	if c.g.as != "" {
		return a2amqtt.ParseAgentRef(c.g.as)
	}
	if c.g.credsDir != "" {
		if id := a2amqtt.CredentialsDir(c.g.credsDir).ClientID(); id != "" {
			return a2amqtt.ParseAgentRef(id)
		}
	}
	org, unit := target.Org, target.Unit
	if org == "" {
		org, unit = "a2actl", "cli"
	}
	return a2amqtt.AgentRef{Org: org, Unit: unit, Agent: "a2actl-" + uuid.NewString()[:8]}, nil
}

func (c *cli) connect(ctx context.Context, target a2amqtt.AgentRef) (*a2amqtt.Conn, int) {
	cfg, code := c.connectConfig(ctx, target)
	if code != exitOK {
		return nil, code
	}
	conn, err := a2amqtt.Connect(ctx, cfg)
	if err != nil {
		return nil, c.fail(exitUnreachable, fmt.Errorf("cannot connect to broker %s: %w", cfg.BrokerURL, err))
	}
	return conn, exitOK
}

// connectConfig is the connection the global flags describe: the broker, TLS, and who a2actl is
// (--as-agent's Secret, --credentials-dir, or --username/--password with --as).
func (c *cli) connectConfig(ctx context.Context, target a2amqtt.AgentRef) (a2amqtt.Config, int) {
	if c.g.asAgent != "" {
		if code := c.useAgentCredentials(ctx); code != exitOK {
			return a2amqtt.Config{}, code
		}
	}
	me, err := c.identity(target)
	if err != nil {
		return a2amqtt.Config{}, c.usageErr("--as: " + err.Error())
	}
	if _, err := c.g.tls.TLSConfig(); err != nil {
		// A configuration mistake, not an unreachable broker.
		fmt.Fprintf(c.stderr, "a2actl: TLS settings: %v\n", err)
		return a2amqtt.Config{}, exitUsage
	}
	cfg := a2amqtt.Config{
		BrokerURL: c.g.broker, Username: c.g.username, Password: c.g.password, TLSFiles: c.g.tls,
		Agent: me, Logger: c.log, ConnectTimeout: 5 * time.Second, FailFast: true,
	}
	switch {
	case c.agentCreds != nil:
		cfg.Username, cfg.Password, cfg.Credentials = "", "", c.agentCreds.source
		if c.agentCreds.tls != nil && c.g.tls.IsZero() {
			cfg.TLSFiles, cfg.TLSConfig = a2amqtt.TLSFiles{}, c.agentCreds.tls
		}
	case c.g.credsDir != "":
		cfg.Username, cfg.Password, cfg.Credentials = "", "", a2amqtt.CredentialsDir(c.g.credsDir)
	}
	return cfg, exitOK
}

// useAgentCredentials reads --as-agent's credentials Secret (once per run): the identity becomes
// the Agent's client ID, and the Secret's broker URL is used when neither --broker nor A2A_BROKER
// named one.
func (c *cli) useAgentCredentials(ctx context.Context) int {
	if c.agentCreds == nil {
		creds, err := loadAgentCredentials(ctx, c.g.kubeconfig, c.g.namespace, c.g.asAgent)
		if err != nil {
			return c.fail(exitUsage, fmt.Errorf("--as-agent %s: %w", c.g.asAgent, err))
		}
		c.agentCreds = creds
	}
	c.g.as = c.agentCreds.clientID
	if c.agentCreds.brokerURL != "" && !c.g.brokerGiven {
		c.g.broker = c.agentCreds.brokerURL
	}
	return exitOK
}

func closeConn(conn *a2amqtt.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// fail prints err (as JSON with --json) and returns code.
func (c *cli) fail(code int, err error) int {
	if c.g.json {
		out := map[string]any{"message": err.Error(), "exitCode": code}
		var rpcErr *a2amqtt.RPCError
		if errors.As(err, &rpcErr) {
			out["code"] = rpcErr.Code
			out["rpcMessage"] = rpcErr.Message
			if k := rpcErr.A2AError(); k != "" {
				out["a2a_error"] = k
			}
			out["bindingError"] = rpcErr.IsBindingError()
			if len(rpcErr.Data) > 0 {
				out["data"] = rpcErr.Data
			}
		}
		b, _ := json.Marshal(map[string]any{"error": out})
		fmt.Fprintln(c.stderr, string(b))
		return code
	}
	fmt.Fprintf(c.stderr, "a2actl: %v\n", err)
	return code
}

// classify maps an SDK error to an exit code and a human explanation.
func (c *cli) classify(target a2amqtt.AgentRef, err error) int {
	var rpcErr *a2amqtt.RPCError
	switch {
	case errors.As(err, &rpcErr):
		msg := fmt.Sprintf("%s answered with JSON-RPC error %d: %s", target, rpcErr.Code, rpcErr.Message)
		if expected, reason, ok := a2amqtt.ContinuationMismatchOf(err); ok {
			// The conversation service refused an answer that does not fit the agent's hint.
			msg = fmt.Sprintf("%s refused the answer (-32063 continuation_mismatch): %s%s", target, reason, hintNote(a2amqtt.Interruption{Continuation: &expected}))
			return c.fail(exitFailure, explained{msg: msg, err: err})
		}
		switch k := rpcErr.A2AError(); {
		case rpcErr.IsBindingError():
			// -32003/-32004/-32005 are also A2A error codes; error.data.a2a_error says which.
			msg = fmt.Sprintf("%s answered with MQTT binding error %d (a2a_error %s): %s", target, rpcErr.Code, k, rpcErr.Message)
		case k != "":
			msg = fmt.Sprintf("%s answered with JSON-RPC error %d (a2a_error %s): %s", target, rpcErr.Code, k, rpcErr.Message)
		}
		return c.fail(exitFailure, explained{msg: msg, err: err})
	case errors.Is(err, a2amqtt.ErrNoSubscribers):
		return c.fail(exitOffline, fmt.Errorf("agent %s is offline: nobody subscribes to %s: %w", target, target.RequestTopic(), err))
	case errors.Is(err, a2amqtt.ErrNoReply), errors.Is(err, a2amqtt.ErrStreamIdle), errors.Is(err, context.DeadlineExceeded):
		return c.fail(exitTimeout, fmt.Errorf("timeout waiting for %s: %w", target, err))
	}
	return c.fail(exitFailure, err)
}

// explained replaces an error's text with a friendlier one while keeping
// the original reachable for errors.As (JSON output needs the RPC fields).
type explained struct {
	msg string
	err error
}

func (e explained) Error() string { return e.msg }
func (e explained) Unwrap() error { return e.err }

func (c *cli) agents(ctx context.Context, org string, wait time.Duration) int {
	if org == "" && c.g.as != "" {
		// An agent identity may read the discovery topics of its own org only (operator ACLs).
		if me, err := a2amqtt.ParseAgentRef(c.g.as); err == nil {
			org = me.Org
		}
	}
	conn, code := c.connect(ctx, a2amqtt.AgentRef{Org: org, Unit: "cli"})
	if conn == nil {
		return code
	}
	defer closeConn(conn)
	// Cards are verified when there is a trust anchor (--card-keys, or the retained keys).
	trust, err := c.cardTrust(ctx, conn, false)
	if err != nil {
		return c.fail(exitFailure, err)
	}
	conn.TrustCards(trust)
	dir, err := a2amqtt.NewDirectory(ctx, conn, a2amqtt.DirectoryFilter(org))
	if err != nil {
		return c.fail(exitFailure, err)
	}
	// Retained cards arrive right after SUBACK; wait a moment to collect.
	select {
	case <-time.After(wait):
	case <-ctx.Done():
	}
	entries := dir.Agents()
	if c.g.json {
		type row struct {
			Agent  string         `json:"agent"`
			Status string         `json:"status"`
			Source string         `json:"statusSource"`
			Card   *a2a.AgentCard `json:"card,omitempty"`
			Error  string         `json:"cardError,omitempty"`
			// Signature is verified, unverified or invalid; absent without a trust anchor.
			Signature string `json:"signature,omitempty"`
		}
		rows := []row{}
		for _, e := range entries {
			r := row{Agent: e.Agent.String(), Status: e.Presence.Status, Source: e.Presence.Source, Card: e.Card, Signature: e.Signature.State}
			if e.CardError != nil {
				r.Error = e.CardError.Error()
			}
			rows = append(rows, r)
		}
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rows)
		return exitOK
	}
	if len(entries) == 0 {
		fmt.Fprintf(c.stdout, "no agents registered under %s\n", a2amqtt.DirectoryFilter(org))
		return exitOK
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	if trust != nil {
		printSignedAgents(tw, entries)
		return exitOK
	}
	fmt.Fprintln(tw, "AGENT\tSTATUS\tSOURCE\tNAME\tDESCRIPTION")
	for _, e := range entries {
		name, desc := "", ""
		if e.Card != nil {
			name, desc = e.Card.Name, e.Card.Description
		}
		if e.CardError != nil {
			desc = e.CardError.Error()
		}
		status := e.Presence.Status
		if status == "" {
			status = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Agent, status, e.Presence.Source, name, desc)
	}
	_ = tw.Flush()
	return exitOK
}

func (c *cli) requester(ctx context.Context, conn *a2amqtt.Conn) (*a2amqtt.Requester, error) {
	return a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{
		FirstReplyTimeout: c.g.timeout, MaxAttempts: c.g.attempts,
	}})
}

// defaultPresenceWait covers the SDK's longest reconnect backoff (5 s): after a broker restart
// without persistence the retained card is back only when the agent has reconnected, and a
// 1 s wait called registered agents "not registered" (issue 9.3).
const defaultPresenceWait = 5 * time.Second

// checkPresence looks the agent up first so "offline" and "not registered"
// are reported as such instead of as a timeout.
func (c *cli) checkPresence(ctx context.Context, conn *a2amqtt.Conn, ref a2amqtt.AgentRef) int {
	if err := c.pinCardKeys(conn); err != nil {
		return c.fail(exitUsage, err)
	}
	_, pres, err := a2amqtt.ResolveCard(ctx, conn, ref, c.g.presence)
	if errors.Is(err, a2amqtt.ErrAgentNotFound) {
		return c.fail(exitOffline, fmt.Errorf("agent %s is not registered: no retained card on %s within %s", ref, ref.DiscoveryTopic(), c.g.presence))
	}
	if err != nil {
		return c.fail(exitFailure, err)
	}
	if pres.Status == a2amqtt.StatusOffline {
		// Advisory only (the profile forbids skipping request handling on
		// status alone): warn, then try anyway.
		fmt.Fprintf(c.stderr, "a2actl: warning: agent %s is marked offline (source %s); trying anyway\n", ref, pres.Source)
	}
	return exitOK
}

// session is where send and chat start: a connection as the caller's identity, the agent looked
// up (so "not registered" and "offline" are told apart from a timeout) and a transport to it.
type session struct {
	conn *a2amqtt.Conn
	tr   *a2amqtt.Transport
}

// open is the connection preamble of send and chat; the code is the exit code when it fails.
func (c *cli) open(ctx context.Context, ref a2amqtt.AgentRef) (*session, int) {
	conn, code := c.connect(ctx, ref)
	if conn == nil {
		return nil, code
	}
	if code := c.checkPresence(ctx, conn, ref); code != exitOK {
		closeConn(conn)
		return nil, code
	}
	r, err := c.requester(ctx, conn)
	if err != nil {
		closeConn(conn)
		return nil, c.fail(exitFailure, err)
	}
	return &session{conn: conn, tr: r.Transport(ref)}, exitOK
}

func (s *session) close() { closeConn(s.conn) }

func (c *cli) send(ctx context.Context, ref a2amqtt.AgentRef, msg *a2a.Message, stream bool) int {
	s, code := c.open(ctx, ref)
	if s == nil {
		return code
	}
	defer s.close()
	req := &a2a.SendMessageRequest{Message: msg}
	if !stream {
		res, err := s.tr.SendMessage(ctx, nil, req)
		if err != nil {
			return c.classify(ref, err)
		}
		return c.printResult(res)
	}
	var last a2a.Event
	for ev, err := range s.tr.SendStreamingMessage(ctx, nil, req) {
		if err != nil {
			return c.classify(ref, err)
		}
		last = ev
		c.printEvent(ev)
	}
	return c.exitFor(last)
}

func (c *cli) printResult(res a2a.SendMessageResult) int {
	if c.g.json {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(a2a.StreamResponse{Event: res})
		return c.exitFor(res)
	}
	if t, ok := res.(*a2a.Task); ok {
		fmt.Fprintf(c.stdout, "task %s (context %s): %s\n", t.ID, t.ContextID, shortState(t.Status.State))
		if i, ok := a2amqtt.InterruptionOf(t); ok {
			how := `"..."`
			if i.ExpectsApproval() {
				how = `--approve|--deny "reason"`
			}
			fmt.Fprintf(c.stdout, "agent asks: %s%s\n(answer with: a2actl send ... --task-id %s --context-id %s %s)\n", i.Question(), hintNote(i), t.ID, t.ContextID, how)
			return c.exitFor(res)
		}
	}
	fmt.Fprintln(c.stdout, a2amqtt.ResultText(res))
	return c.exitFor(res)
}

func (c *cli) exitFor(ev a2a.Event) int {
	var state a2a.TaskState
	switch v := ev.(type) {
	case *a2a.Task:
		state = v.Status.State
	case *a2a.TaskStatusUpdateEvent:
		state = v.Status.State
	}
	if state == a2a.TaskStateFailed || state == a2a.TaskStateRejected {
		return exitFailure
	}
	return exitOK
}

func shortState(s a2a.TaskState) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(string(s), "TASK_STATE_"), "_", "-"))
}

func (c *cli) printEvent(ev a2a.Event) {
	if c.g.json {
		b, _ := json.Marshal(a2a.StreamResponse{Event: ev})
		fmt.Fprintln(c.stdout, string(b))
		return
	}
	switch v := ev.(type) {
	case *a2a.TaskStatusUpdateEvent:
		line := "[" + shortState(v.Status.State) + "]"
		if t := a2amqtt.TextOf(v.Status.Message); t != "" {
			line += " " + t
		}
		if i, ok := a2amqtt.InterruptionOf(v); ok {
			line += hintNote(i)
		}
		fmt.Fprintln(c.stdout, line)
	case *a2a.TaskArtifactUpdateEvent:
		if v.Artifact != nil {
			var parts []string
			for _, p := range v.Artifact.Parts {
				parts = append(parts, p.Text())
			}
			fmt.Fprintf(c.stdout, "[artifact] %s\n", strings.Join(parts, ""))
		}
	case *a2a.Task:
		note := ""
		if i, ok := a2amqtt.InterruptionOf(v); ok {
			note = hintNote(i)
		}
		fmt.Fprintf(c.stdout, "[%s] %s%s\n", shortState(v.Status.State), a2amqtt.ResultText(v), note)
	case *a2a.Message:
		fmt.Fprintf(c.stdout, "agent> %s\n", a2amqtt.TextOf(v))
	}
}

func isTerminal(ev a2a.Event) bool {
	switch v := ev.(type) {
	case *a2a.TaskStatusUpdateEvent:
		return v.Status.State.Terminal()
	case *a2a.Task:
		return v.Status.State.Terminal()
	}
	return false
}

// hintNote renders a continuation hint for a human: " (approval expected: answer approve/deny)".
func hintNote(i a2amqtt.Interruption) string {
	h := i.Continuation
	if h == nil {
		return ""
	}
	var notes []string
	switch h.ExpectedInput {
	case a2amqtt.ExpectApproval:
		notes = append(notes, "approval expected: answer approve/deny")
	case a2amqtt.ExpectFreeText:
		notes = append(notes, "free text expected")
	case a2amqtt.ExpectStructuredArtifact:
		notes = append(notes, "structured input expected")
	case a2amqtt.ExpectCredential:
		notes = append(notes, "credential expected")
	}
	if h.ResumeScope == a2amqtt.ResumeNewTaskInContext {
		notes = append(notes, "the answer starts a new task in this conversation")
	}
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, "; ") + ")"
}

// Words that answer an approval request in chat (kagent's resume keywords plus "go ahead", the
// confirm agent's own phrase); anything else is sent as text.
var (
	approveWords = []string{"approve", "approved", "yes", "y", "ok", "go ahead", "proceed", "continue"}
	denyWords    = []string{"deny", "denied", "no", "n", "reject", "cancel", "stop"}
)

// parseApproval reads a chat line as an approval answer: an approve/deny word alone, or the
// /approve and /deny commands (with an optional reason).
func parseApproval(line string) (approve bool, reason string, ok bool) {
	if approve, reason, ok := parseApprovalCommand(line); ok {
		return approve, reason, ok
	}
	w := strings.ToLower(strings.Trim(strings.TrimSpace(line), ".!"))
	switch {
	case slices.Contains(approveWords, w):
		return true, "", true
	case slices.Contains(denyWords, w):
		return false, "", true
	}
	return false, "", false
}

// parseApprovalCommand reads "/approve [reason]" and "/deny [reason]".
func parseApprovalCommand(line string) (approve bool, reason string, ok bool) {
	cmd, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch cmd {
	case "/approve":
		return true, strings.TrimSpace(rest), true
	case "/deny":
		return false, strings.TrimSpace(rest), true
	}
	return false, "", false
}

// approvalAnswer is the user's text with the structured approval answer beside it.
func approvalAnswer(approve bool, text, reason string) *a2a.Message {
	return a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text), a2amqtt.ApprovalPart(approve, reason))
}
