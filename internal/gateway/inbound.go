package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// SecuritySchemeName names the gateway's security scheme in the cards it serves.
const SecuritySchemeName a2a.SecuritySchemeName = "kubernetesServiceAccount"

// DefaultMaxBodyBytes bounds a request body: the profile's default MQTT payload bound (1 MiB),
// so nothing the bus would refuse is accepted over HTTP.
const DefaultMaxBodyBytes = 1 << 20

// Authenticator says who an HTTP caller is.
type Authenticator interface {
	Authenticate(ctx context.Context, r *http.Request) (Caller, error)
}

// InboundConfig configures the HTTP side.
type InboundConfig struct {
	Directory *Directory
	Auth      Authenticator
	Pool      *Pool
	// BrokerURL is the bus's URL as agents see it (the cards' MQTT interface).
	BrokerURL string
	// PublicURL is the gateway's URL as HTTP callers reach it (the cards' supportedInterfaces);
	// empty: taken from each request's Host.
	PublicURL string
	// MaxBodyBytes bounds a request body (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// KeepAlive is the SSE keep-alive interval (default 15s), so proxies keep idle streams open.
	KeepAlive time.Duration
	// Ring, when set, assigns each caller identity to one replica (ring.go): a request whose
	// caller another replica serves is forwarded to it. Nil: this replica serves every caller.
	Ring *Ring
	// CardKeysAgent names the Agent (usually one without a workload) whose identity reads the
	// card signing keys on the bus, served at JWKSPath; empty: JWKSPath answers 404.
	CardKeysAgent client.ObjectKey
	// CardSigner, when set, signs every card the gateway serves (jku: this gateway's JWKSPath,
	// which then serves its keys beside the bus's). Nil: the served cards are unsigned.
	CardSigner *CardSigner
	Logger     *slog.Logger
}

// Inbound serves the exposed agents over HTTP.
type Inbound struct {
	cfg     InboundConfig
	jsonrpc http.Handler
	mux     *http.ServeMux
	jwks    jwksCache
	// toReplicas carries forwarded requests (forward.go).
	toReplicas http.RoundTripper
}

// NewInbound builds the HTTP handler: for each exposed agent, the card at
// /agents/{org}/{unit}/{agent}/.well-known/agent-card.json and the JSON-RPC endpoint at
// /agents/{org}/{unit}/{agent}/.
func NewInbound(cfg InboundConfig) *Inbound {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	in := &Inbound{cfg: cfg, mux: http.NewServeMux(), toReplicas: replicaTransport(),
		jsonrpc: a2asrv.NewJSONRPCHandler(forwarder{}, a2asrv.WithTransportKeepAlive(cfg.KeepAlive))}
	in.mux.HandleFunc("GET /agents/{org}/{unit}/{agent}/.well-known/agent-card.json", in.serveCard)
	in.mux.HandleFunc("POST /agents/{org}/{unit}/{agent}/{$}", in.serveRPC)
	in.mux.HandleFunc("POST /agents/{org}/{unit}/{agent}", in.serveRPC)
	in.mux.HandleFunc("GET "+JWKSPath, in.serveJWKS)
	in.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	in.mux.HandleFunc("GET /readyz", in.serveReady)
	return in
}

// notReady says why this replica must not take requests yet: with a ring, until it has read
// the replicas' Leases it sees only itself, so it would serve every caller's identity here,
// taking each from the replica that holds it.
func (in *Inbound) notReady() error {
	if in.cfg.Ring != nil && !in.cfg.Ring.Ready() {
		return errors.New("the gateway replicas' Leases have not been read yet, so which replica serves which caller is not known")
	}
	return nil
}

// serveReady is the readiness probe: 503 with the reason while notReady.
func (in *Inbound) serveReady(w http.ResponseWriter, _ *http.Request) {
	if err := in.notReady(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// ServeHTTP implements http.Handler.
func (in *Inbound) ServeHTTP(w http.ResponseWriter, r *http.Request) { in.mux.ServeHTTP(w, r) }

// writeError answers with a JSON-RPC error object and an HTTP status: the refusals that come
// before a JSON-RPC request is read (authentication, identity, body size) are HTTP errors that a
// JSON-RPC client can still read.
func writeError(w http.ResponseWriter, status int, e *rpcerr.Error) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="a2a-fleet-gateway"`)
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": e})
}

func refusal(sentinel error, message string) *rpcerr.Error {
	return rpcerr.NewA2A(sentinel, message, nil, time.Now())
}

// target reads the agent named by the path.
func target(r *http.Request) (a2amqtt.AgentRef, error) {
	ref := a2amqtt.AgentRef{Org: r.PathValue("org"), Unit: r.PathValue("unit"), Agent: r.PathValue("agent")}
	return ref, ref.Validate()
}

// admit authenticates the caller and finds its Agent and the target; on failure it has answered.
func (in *Inbound) admit(w http.ResponseWriter, r *http.Request) (caller, tgt *a2av1.Agent, ok bool) {
	c, err := in.cfg.Auth.Authenticate(r.Context(), r)
	if err != nil {
		if errors.Is(err, ErrUnauthenticated) {
			writeError(w, http.StatusUnauthorized, refusal(a2a.ErrUnauthenticated, err.Error()+": present a Kubernetes ServiceAccount token as Authorization: Bearer"))
		} else {
			in.cfg.Logger.Error("authenticate", "err", err)
			writeError(w, http.StatusServiceUnavailable, refusal(a2a.ErrInternalError, "cannot check the token now"))
		}
		return nil, nil, false
	}
	caller, err = in.cfg.Directory.CallerAgent(r.Context(), c.Namespace, c.ServiceAccount)
	if err != nil {
		status := http.StatusForbidden
		if !errors.Is(err, ErrNoAgentForCaller) && !errors.Is(err, ErrAmbiguousCaller) {
			status = http.StatusServiceUnavailable
		}
		writeError(w, status, refusal(a2a.ErrUnauthorized, fmt.Sprintf("ServiceAccount %s/%s acts as no Agent: %v", c.Namespace, c.ServiceAccount, err)))
		return nil, nil, false
	}
	ref, err := target(r)
	if err != nil {
		writeError(w, http.StatusNotFound, refusal(a2a.ErrInvalidRequest, "bad agent path: "+err.Error()))
		return nil, nil, false
	}
	tgt, err = in.cfg.Directory.ExposedAgent(r.Context(), ref)
	if err != nil {
		status := http.StatusNotFound
		if !errors.Is(err, ErrNotExposed) {
			status = http.StatusServiceUnavailable
		}
		writeError(w, status, refusal(a2a.ErrInvalidRequest, fmt.Sprintf("%s: %v", ref, err)))
		return nil, nil, false
	}
	return caller, tgt, true
}

// baseURL is the gateway's URL for callers.
func (in *Inbound) baseURL(r *http.Request) string {
	if in.cfg.PublicURL != "" {
		return strings.TrimSuffix(in.cfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// Card is the card the gateway serves for an exposed agent: the manifest's card (as the operator
// publishes it on the bus) whose interface is the gateway's JSON-RPC endpoint for the agent, and
// whose security scheme is the ServiceAccount bearer token.
func Card(ag *a2av1.Agent, brokerURL, endpoint string) *a2a.AgentCard {
	card := registration.BuildCard(ag, identity.Of(ag), "", brokerURL)
	card.SupportedInterfaces = []*a2a.AgentInterface{a2a.NewAgentInterface(endpoint, a2a.TransportProtocolJSONRPC)}
	card.SecuritySchemes = a2a.NamedSecuritySchemes{SecuritySchemeName: a2a.HTTPAuthSecurityScheme{
		Scheme: "Bearer", BearerFormat: "JWT",
		Description: "a Kubernetes ServiceAccount token (TokenReview); the ServiceAccount acts as the Agent whose spec.http.serviceAccounts lists it",
	}}
	card.SecurityRequirements = a2a.SecurityRequirementsOptions{{SecuritySchemeName: a2a.SecuritySchemeScopes{}}}
	return card
}

func (in *Inbound) serveCard(w http.ResponseWriter, r *http.Request) {
	_, tgt, ok := in.admit(w, r)
	if !ok {
		return
	}
	ref := identity.Of(tgt)
	base := in.baseURL(r)
	endpoint := fmt.Sprintf("%s/agents/%s/%s/%s/", base, ref.Org, ref.Unit, ref.Agent)
	card := Card(tgt, in.cfg.BrokerURL, endpoint)
	if in.cfg.CardSigner != nil {
		// Signed for this URL: the jku is this gateway's key set, the keys the gateway's own.
		if err := cardsig.SignCard(card, base+JWKSPath, in.cfg.CardSigner.Keys()...); err != nil {
			in.cfg.Logger.Error("sign served card", "agent", ref.String(), "err", err)
			http.Error(w, "cannot sign the card now", http.StatusInternalServerError)
			return
		}
	}
	a2asrv.NewStaticAgentCardHandler(card).ServeHTTP(w, r)
}

func (in *Inbound) serveRPC(w http.ResponseWriter, r *http.Request) {
	if err := in.notReady(); err != nil {
		// Retryable: readiness keeps the Service's traffic away meanwhile; this is for a
		// request that reaches the pod anyway (a peer's forward, a port-forward).
		writeError(w, http.StatusServiceUnavailable, rpcerr.New(a2amqtt.A2AErrorResponderUnavailable, "the gateway is starting: "+err.Error(), nil))
		return
	}
	if r.ContentLength > in.cfg.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, refusal(a2a.ErrInvalidRequest,
			fmt.Sprintf("request body of %d bytes is larger than the gateway accepts (%d bytes)", r.ContentLength, in.cfg.MaxBodyBytes)))
		return
	}
	caller, tgt, ok := in.admit(w, r)
	if !ok {
		return
	}
	if in.cfg.Ring != nil && r.Header.Get(ForwardedHeader) == "" {
		if owner := in.cfg.Ring.Owner(identity.Of(caller).ClientID()); owner.ID != in.cfg.Ring.Self() {
			in.forward(w, r, owner)
			return
		}
	}
	req, release, err := in.cfg.Pool.Requester(r.Context(), caller)
	if err != nil {
		in.cfg.Logger.Error("caller connection", "caller", identity.Of(caller).String(), "err", err)
		writeError(w, http.StatusServiceUnavailable, rpcerr.New(a2amqtt.A2AErrorResponderUnavailable, "the gateway cannot connect as the caller's Agent now", nil))
		return
	}
	defer release()
	body, readErr := readBody(w, r, in.cfg.MaxBodyBytes)
	slot := &errorSlot{}
	ctx := context.WithValue(r.Context(), errorSlotKey{}, slot)
	transport := req.Transport(identity.Of(tgt))
	ctx = withTransport(ctx, transport)
	var out http.ResponseWriter = w
	if env, sendReq, fast := readSend(body); readErr == nil && fast {
		var answered, started bool
		var callErr error
		if env.Method == methodSendStreamingMessage {
			answered, started, callErr = in.streamFast(ctx, w, transport, &env, sendReq)
		} else {
			answered, callErr = sendFast(ctx, w, transport, &env, sendReq)
		}
		if answered {
			return
		}
		if callErr != nil {
			ctx = context.WithValue(ctx, callErrorKey{}, callErr)
		}
		if started {
			// The stream's events went out: a2a-go adds its error event to them.
			out = headersSent{w}
		}
	}
	// a2a-go's server reads the body as it came, a read error (a body over the bound) included.
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{readErr}))
	in.jsonrpc.ServeHTTP(&errorWriter{ResponseWriter: out, slot: slot}, r.WithContext(ctx))
}

// readBody reads a request's body, at most limit bytes, into a buffer of the length the
// request declares when it declares one (io.ReadAll would grow its buffer from 512 bytes).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength <= 0 || r.ContentLength > limit {
		return io.ReadAll(body)
	}
	// One byte more than declared, so that the read goes on to the body's end: net/http then
	// watches the connection, and the request's context ends if the caller goes away.
	buf := make([]byte, r.ContentLength+1)
	n, err := io.ReadFull(body, buf)
	if int64(n) == r.ContentLength && errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil // the whole declared body, then its end
	}
	return buf[:n], err
}

// errReader returns err (io.EOF when nil) at every read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}
