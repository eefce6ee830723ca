package gateway

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// ForwardedHeader marks a request one replica forwarded to the replica assigned its caller: that
// replica serves it itself, whatever its own view of the ring, so a request is forwarded at most
// once (during a change of the live set two replicas may briefly disagree).
const ForwardedHeader = "X-A2a-Fleet-Gateway-Forwarded"

// ReplicaDialTimeout bounds connecting to another replica. A replica that vanished without
// leaving the ring (a pod deleted without grace, a node lost) keeps its Lease until it expires,
// and a connection to its address is not refused but unanswered: with the default dialer's 30 s
// its callers waited ~20 s for the 503 (seen on kind); replicas are in one cluster network.
const ReplicaDialTimeout = 2 * time.Second

// replicaTransport is http.DefaultTransport's setup with ReplicaDialTimeout.
func replicaTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: ReplicaDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	return t
}

// forward passes an authenticated request on to the replica assigned its caller, as it came
// (its bearer token too: the owner authenticates it again, from its token cache after the
// first), streaming the response back (SSE events as they come).
func (in *Inbound) forward(w http.ResponseWriter, r *http.Request, owner Member) {
	target, err := url.Parse(owner.Address)
	if err != nil || owner.Address == "" {
		in.cfg.Logger.Error("gateway replica address", "replica", owner.ID, "address", owner.Address, "err", err)
		in.ownerUnavailable(w)
		return
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set(ForwardedHeader, in.cfg.Ring.Self())
		},
		Transport: in.toReplicas,
		// SSE: every event is written through at once.
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(in.cfg.Logger.Handler(), slog.LevelInfo),
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			in.cfg.Logger.Info("forward to gateway replica", "replica", owner.ID, "err", err)
			in.ownerUnavailable(w)
		},
	}
	proxy.ServeHTTP(w, r)
}

// ownerUnavailable answers a request whose caller's replica cannot be reached (it stopped and the
// ring has not yet seen it go): the profile's responder_unavailable, with Retry-After, as the
// ring moves the caller within its read interval (clean stop) or the Lease TTL (crash).
func (in *Inbound) ownerUnavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, rpcerr.New(a2amqtt.A2AErrorResponderUnavailable,
		"the gateway replica serving this caller is not reachable; retry", nil))
}
